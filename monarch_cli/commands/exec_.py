"""``monarch exec``: PyTorch Monarch's verb: a command on one rank, a point, a mesh or every rank."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import click

from monarch.errors import UsageError
from monarch_cli.commands._common import CommandCommand, handled, name_option, opts
from monarch_cli.output import err, escape, print_json


@dataclass
class Target:
    """The hosts a command runs on, and the words that say which."""

    hosts: list
    what: str


@click.command("exec", cls=CommandCommand, context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
@click.option("--all", "run_all", is_flag=True, help="Every rank of every mesh (output streamed, prefixed by host).")
@click.option("--mesh", metavar="NAME", help="Every rank of the mesh NAME (output streamed, prefixed by host).")
@click.option("--one", is_flag=True, help="Rank 0 of the first mesh (the default).")
@click.option("--point", metavar="DIM=N,...", help="One coordinate of the first mesh, e.g. --point hosts=1.")
@click.option("--per-host", "per_host", metavar="DIM=N",
              help="Start N processes per host along DIM (one dimension); each gets MONARCH_RANK_<DIM>, MONARCH_SIZE_<DIM>.")
@click.option("--env", "-e", multiple=True, metavar="K=V", help="Extra environment variable (repeatable).")
@click.option("--workdir", metavar="DIR", help="Working directory on the hosts (default: this one).")
@click.option("--kill", is_flag=True, help="Release the reservation after the command finishes.")
@click.option("--script", metavar="FILE|-", help="Run this bash script ('-' reads it from stdin).")
@click.option("-m", "module", metavar="MODULE", help="Run a Python module (python -m MODULE).")
@name_option
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def exec_(ctx: click.Context, run_all: bool, mesh: str | None, one: bool, point: str | None, per_host: str | None,
          env: tuple[str, ...], workdir: str | None, kill: bool, script: str | None, module: str | None,
          name: str | None, cmd: tuple[str, ...]) -> None:
    """Run CMD on the reservation's ranks (Monarch's `monarch exec`); exit status: the highest of the ranks'
    (a rank killed by signal N counts as 128+N).

    Targeting (one of; default --one): --one rank 0, --point DIM=N,... one coordinate, --mesh NAME
    or --all every rank.  Where Monarch writes --all/--mesh output to files on the workers, this
    streams every rank's output here, each line prefixed by its host, as `monarch run` does
    (`monarch logs` keeps it too).
    """
    o = opts(ctx)
    with handled(ctx):
        if sum(bool(x) for x in (run_all, mesh, one, point)) > 1:
            raise UsageError("--all, --mesh, --one and --point exclude each other", "pick one (default: --one)")
        argv = list(cmd)
        if argv[:1] == ["--"]:
            argv = argv[1:]
        if module:
            argv = ["python", "-m", module, *argv]
        if script is not None:
            text = sys.stdin.read() if script == "-" else _read(script)
            argv = ["bash", "-c", text, "monarch-exec-script", *argv]
        if not argv:
            raise UsageError("no command specified", "use cmd args (`monarch exec -- CMD ...`) or --script")
        extra = _parse_env(env)
        dim, n = _parse_per_host(per_host) if per_host else (None, 1)
        from monarch._workbench.reserve import load_live

        record, path = load_live(name, progress=lambda *a: None)
        meshes = mesh_layout(record, path)
        target = select(meshes, run_all, mesh, point, dim, n)
        if dim:
            argv = _fan_out(argv, dim, n)
        code = _run(record, target.hosts, argv, extra, workdir, o.json)
        if kill:
            from monarch._workbench.reserve import release

            release(record, path)
            err.print(f"Killed job {escape(record.name)!s} ({record.job_id})")
        raise click.exceptions.Exit(code)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"cannot read script {path}: {e.strerror}") from None


def _parse_env(env: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for kv in env:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise UsageError(f"Invalid env var (expected KEY=VALUE): {kv!r}")
        out[k] = v
    return out


def _parse_per_host(spec: str) -> tuple[str, int]:
    parts = [p for p in spec.split(",") if p.strip()]
    if len(parts) != 1:
        raise UsageError(f"--per-host takes one dimension DIM=N, got {spec!r}", "e.g. --per-host gpu=4")
    k, sep, v = parts[0].partition("=")
    try:
        n = int(v)
    except ValueError:
        n = 0
    if not sep or not k.strip() or n < 1:
        raise UsageError(f"--per-host expects DIM=N with N >= 1, got {spec!r}", "e.g. --per-host gpu=4")
    return k.strip(), n


def _parse_point(spec: str) -> dict[str, int]:
    point = {}
    for pair in spec.split(","):
        k, sep, v = pair.partition("=")
        try:
            point[k.strip()] = int(v)
        except ValueError:
            raise UsageError(f"--point expects DIM=N,..., got {spec!r}", "e.g. --point hosts=1") from None
        if not sep or not k.strip():
            raise UsageError(f"--point expects DIM=N,..., got {spec!r}", "e.g. --point hosts=1")
    return point


def mesh_layout(record, path: str) -> dict[str, list]:
    """Mesh name -> its hosts in rank order: the job's meshes (ProcessJob({"a": 1, "b": 2})), else one 'hosts'."""
    from monarch.job.job import job_for_record

    hosts = sorted(record.hosts, key=lambda h: h.host_rank)
    try:
        sizes = job_for_record(record, path)._mesh_sizes()
    except Exception:
        sizes = {"hosts": len(hosts)}
    if sum(sizes.values()) != len(hosts):
        sizes = {"hosts": len(hosts)}
    meshes, i = {}, 0
    for mesh_name, size in sizes.items():
        meshes[mesh_name] = hosts[i:i + size]
        i += size
    return meshes


def select(meshes: dict[str, list], run_all: bool, mesh: str | None, point: str | None,
           dim: str | None, per_host: int) -> Target:
    """The hosts Monarch's targeting names (a --point on the per-host DIM is checked, all its procs run)."""
    first = next(iter(meshes))
    if run_all:
        return Target([h for hs in meshes.values() for h in hs], "all ranks")
    if mesh is not None:
        if mesh not in meshes:
            raise UsageError(f"Mesh {mesh!r} not found. Available: {list(meshes)}")
        return Target(meshes[mesh], f"mesh {mesh}")
    if point is not None:
        coords = _parse_point(point)
        extent = {"hosts": len(meshes[first]), **({dim: per_host} if dim else {})}
        for k, v in coords.items():
            size = extent.get(k if k != "host" else "hosts")
            if size is None:
                raise UsageError(f"--point names dimension {k!r}; mesh {first!r} has {_extent(extent)}")
            if not 0 <= v < size:
                raise UsageError(f"--point {k}={v} is outside mesh {first!r} ({_extent(extent)})")
        h = coords.get("hosts", coords.get("host", 0))
        return Target([meshes[first][h]], f"point {point}")
    return Target(meshes[first][:1], "rank 0")


def _extent(extent: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in extent.items())


def _fan_out(argv: list[str], dim: str, n: int) -> list[str]:
    """N copies of the command on each host, each told its place; the host's exit code is their highest."""
    key = "".join(c if c.isalnum() else "_" for c in dim).upper()
    script = (f'rc=0; pids=""; for i in $(seq 0 {n - 1}); do MONARCH_RANK_{key}=$i MONARCH_SIZE_{key}={n} '
              'MONARCH_RANK_HOSTS=$MONARCH_HOST_RANK MONARCH_SIZE_HOSTS=$MONARCH_NUM_HOSTS "$@" & pids="$pids $!"; done; '
              'for p in $pids; do wait $p; r=$?; [ $r -gt $rc ] && rc=$r; done; exit $rc')
    return ["bash", "-c", script, "monarch-exec", *argv]


def _run(record, hosts: list, argv: list[str], extra: dict, workdir: str | None, as_json: bool) -> int:
    """Run on ``hosts`` with the run engine, ranks independent (recorded for `monarch logs`); the run's status."""
    from monarch._workbench.run import FailurePolicy, run_command, run_failure
    from monarch_cli.commands.run import outcome_doc

    # Monarch's exec: one rank failing does not stop the others (torchrun's rule in `monarch run`).
    outcome = run_command(record, argv, hosts=hosts, env=extra, cwd=workdir or os.getcwd(),
                          color=sys.stdout.isatty() and not as_json, all_to_stderr=as_json,
                          policy=FailurePolicy.INDEPENDENT)
    failure = run_failure(record, outcome)
    if as_json:
        print_json(outcome_doc(outcome, failure))
    elif failure is not None:
        err.print(f"[dim]{escape(failure.message)}[/]")
    return outcome.exit_code
