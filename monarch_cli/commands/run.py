"""``monarch run``: run a command on every reserved host, or an actor program against them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import click

from monarch.errors import UsageError
from monarch_cli.commands._common import name_option, handled, opts
from monarch_cli.output import err, escape, print_json

if TYPE_CHECKING:
    from monarch.job.run import RemoteRun


@click.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@name_option
@click.option("--hosts", help="Only these host ranks, e.g. 0,2.")
@click.option("--env", "-e", multiple=True, help="K=V added to the environment (repeatable).")
@click.option("--workdir", "-w", help="Working directory on the hosts (default: this one).")
@click.option("--detach", "-d", is_flag=True, help="Start and return; read output with `monarch logs`.")
@click.option("--pdb", "post_mortem", is_flag=True,
              help="A rank that dies of an uncaught Python exception waits in a post-mortem pdb for `monarch debug`.")
@click.option("--warn-before", type=float, envvar="MONARCH_WARN_BEFORE", metavar="MINUTES",
              help="Warn when the reservation is this close to its time limit (Slurm; default 5).")
@click.pass_context
def run(ctx: click.Context, command: tuple[str, ...], name: str | None, hosts: str | None, env: tuple[str, ...],
        workdir: str | None, detach: bool, post_mortem: bool, warn_before: float | None) -> None:
    """Run CMD on the reserved hosts with torchrun's multi-node environment, streaming output."""
    from monarch.job.reserve import load_live, time_warning_s
    from monarch.job.run import LinePrinter, RemoteRun, RunLock, record_run, reservation_end, watch_time_limit
    o = opts(ctx)
    argv = list(command or []) + list(ctx.args)
    with handled(ctx):
        if not argv:
            raise UsageError("nothing to run", "`monarch run -- CMD ARGS...` or `monarch run script.py`")
        extra = {}
        for kv in env or []:
            k, sep, v = kv.partition("=")
            if not sep or not k:
                raise UsageError(f"--env expects K=V, got {kv!r}")
            extra[k] = v
        if post_mortem:
            extra.setdefault("MONARCH_DEBUG_POST_MORTEM", "1")
        warn_s = time_warning_s(warn_before)
        record, path = load_live(name, progress=lambda *a: None)
        if record.workspace:
            _push_workspace(record, o.verbose)
        if argv[0].endswith(".py") and os.path.isfile(argv[0]) and not hosts:
            raise click.exceptions.Exit(_run_controller(argv, path, extra))
        selected = record.hosts
        if hosts:
            try:
                wanted = [int(x) for x in hosts.split(",") if x.strip()]
            except ValueError:
                raise UsageError(f"--hosts expects ranks like 0,2, got {hosts!r}") from None
            by_rank = {h.host_rank: h for h in record.hosts}
            missing = [w for w in wanted if w not in by_rank]
            if missing:
                raise UsageError(f"no host rank {missing[0]} in this reservation (it has 0..{len(record.hosts) - 1})")
            selected = [by_rank[w] for w in wanted]
        else:
            selected = sorted(record.hosts, key=lambda h: h.host_rank)
        printer = LinePrinter(selected, sys.stdout.isatty() and not o.json)
        with RunLock(record):
            rr = RemoteRun(record, selected, argv, env=extra, cwd=workdir or os.getcwd(), on_output=printer.write,
                           detach=detach,
                           on_debug=_say_debug_waiting)
            record_run(record, rr.run_id, argv, selected, detach)
            if detach:
                rr.start()
                if o.json:
                    print_json({"run_id": rr.run_id, "detached": True})
                else:
                    err.print(f"started run {rr.run_id} on {len(selected)} host(s); `monarch logs --run {rr.run_id} -f` follows it")
                return
            # Handlers first: a Ctrl-C that lands as the ranks start must stop them too.
            with _signals_stop(rr):
                rr.start()
                watch = watch_time_limit(record, rr.done, warn_s, lambda line: err.print(f"[yellow]warning:[/] {escape(line)}"))
                while not rr.wait(0.2):
                    pass
            code = rr.outcome.exit_code
        printer.flush()
        watch.join(_WATCH_JOIN_S)
        outcome = rr.outcome
        if o.json:
            print_json({"run_id": rr.run_id, "exit_code": code,
                        "ranks": [{"rank": r.rank, "host": r.host, "exit_code": r.exit_code, "reason": r.reason} for r in outcome.results]})
        elif outcome.interrupted:
            err.print("[yellow]interrupted: stopped every rank[/]")
        elif outcome.first_failure is not None:
            f = outcome.first_failure
            ended = reservation_end(record)
            if ended:
                # The ranks died with the allocation: say that, not only the signal they got.
                err.print(f"[bold red]error:[/] the reservation ended during the run "
                          f"({record.spec.scheduler} job {record.job_id}: {escape(ended)})")
                err.print("  [dim]hint:[/] `monarch serve` reserves again (`monarch status` shows why it ended)")
                if o.verbose:
                    err.print(f"  first failure: rank {f.rank} on {f.host} {escape(f.reason)}")
            else:
                err.print(f"[bold red]error:[/] rank {f.rank} on {f.host} {f.reason}")
        raise click.exceptions.Exit(code)


def _push_workspace(record, verbose: bool) -> None:
    """Changed files go to every host before the run starts there (a stat per file when nothing changed)."""
    from monarch.job.workspace import ReservationSync, describe

    results = ReservationSync(record).sync()
    if verbose or any(r.changed for r in results):
        err.print(f"[dim]{escape(describe(results, len(record.hosts)))}[/]")


def _say_debug_waiting(session: dict) -> None:
    """Once per debug session a rank opens: which rank waits, and the command that attaches."""
    from monarch_agents.services.debug import waiting_line

    err.print(f"[yellow]{escape(waiting_line(session))}[/]")


#: How long a finished run waits for the time-limit check it started (one squeue: milliseconds).
_WATCH_JOIN_S = 1.0


@contextmanager
def _signals_stop(rr: RemoteRun) -> Iterator[None]:
    """While inside, the first Ctrl-C/SIGTERM stops every rank (TERM, then KILL); a second one kills them."""
    interrupts = []

    def on_signal(signum, frame):
        interrupts.append(signum)
        if len(interrupts) == 1:
            threading.Thread(target=rr.stop, daemon=True).start()
        else:
            rr.signal(signal.SIGKILL)
            rr.outcome.interrupted = True
            rr.done.set()

    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def _run_controller(argv: list[str], state_path: str, extra: dict) -> int:
    """Run a single-controller actor program here, its this_host() being the reservation."""
    # MONARCH_JOB: `job_load()` in the program loads this reservation; MONARCH_RUN_JOB: the
    # program talks with its keys.
    env = {**os.environ, **extra, "MONARCH_RUN_JOB": state_path, "MONARCH_JOB": state_path}
    proc = subprocess.Popen([sys.executable, *argv], env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # The program got the same Ctrl-C (same process group); give it a moment to stop.
        try:
            return proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            proc.wait()
            return 130
