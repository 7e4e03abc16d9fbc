"""PyTorch Monarch's argparse command line, ``python -m monarch.tools.cli``, on monarch's machinery.

    python -m monarch.tools.cli apply myjob.job          # reserve the job object myjob.job
    python -m monarch.tools.cli exec -- python train.py  # run on rank 0 (--all, --mesh, --point)
    python -m monarch.tools.cli kill

The subcommands and their arguments are Monarch's (``get_parser()``; its help ends with
``SKILL.md``), each done by ``monarch.tools.commands``.  Our own ``monarch`` command (Click,
``monarch_cli``) has the same verbs and more; the console script ``monarch`` stays ours, so
Monarch's CLI is reached as ``python -m monarch.tools.cli``.  A failure is one line on stderr and
exit status 1 (Monarch prints a traceback).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from monarch.tools.commands import (
    apply_job,
    context_create,
    context_ls,
    context_rm,
    context_use,
    debug,
    exec_on_job,
    kill_context,
    shell_on_job,
)
from monarch.tools.debug_env import _get_debug_server_host, _get_debug_server_port

_DEFAULT_DASHBOARD_PORT: int = 8265
#: How long ``query`` waits for the hosts' answers unless --timeout says (our telemetry's default).
DEFAULT_QUERY_TIMEOUT_SEC: float = 30.0


def _parse_duration(value: str) -> float:
    """``500ms``, ``10s``, ``2m``, ``1h`` as seconds (argparse's type for --time and --timeout)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)\s*", value)
    if m is None:
        raise argparse.ArgumentTypeError("duration must be a positive number followed by ms, s, m, or h")
    seconds = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    if seconds <= 0:
        raise argparse.ArgumentTypeError("duration must be greater than zero")
    return seconds


class _Refused(Exception):
    """A subcommand that cannot do what was asked here: its message is the one line printed."""


class ContextCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        sub = subparser.add_subparsers(title="CONTEXT COMMANDS", dest="context_cmd")
        p = sub.add_parser("create", help="Create a context (without switching to it)")
        p.add_argument("name", type=str, help="Context name")
        p.set_defaults(context_func=lambda a: context_create(a.name))
        p = sub.add_parser("use", help="Make a context the active one (created if new)")
        p.add_argument("name", type=str, help="Context to activate")
        p.set_defaults(context_func=lambda a: context_use(a.name))
        p = sub.add_parser("rm", help="Remove a context, releasing its job")
        p.add_argument("name", type=str, help="Context to remove")
        p.set_defaults(context_func=lambda a: context_rm(a.name))
        p = sub.add_parser("ls", help="List the contexts (* marks the active one)")
        p.set_defaults(context_func=lambda a: context_ls())

    def run(self, args: argparse.Namespace) -> None:
        if not hasattr(args, "context_func"):
            args._subparser.print_help()
            sys.exit(1)
        args.context_func(args)


class ApplyCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("module_path", nargs="?", default=None, type=str,
                               help="The job object as module.attr (e.g. myjob.job), imported from this "
                                    "directory; default: the active context's saved one.")

    def run(self, args: argparse.Namespace) -> None:
        apply_job(args.module_path)


class ExecCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        target = subparser.add_mutually_exclusive_group()
        target.add_argument("--all", action="store_true", default=False, dest="run_all",
                            help="Every rank of every mesh; each rank's output goes to files (printed where).")
        target.add_argument("--mesh", type=str, default=None, metavar="NAME",
                            help="Every rank of mesh NAME; each rank's output goes to files.")
        target.add_argument("--one", action="store_true", default=False,
                            help="Rank 0 of the first mesh, output streamed here (the default).")
        target.add_argument("--point", type=str, default=None, metavar="DIM=N,DIM=N",
                            help="One coordinate of the first mesh (e.g. hosts=1), output streamed here.")
        subparser.add_argument("--per-host", type=str, default=None, metavar="DIM=N", dest="per_host",
                               help="Start N processes per host along DIM first (e.g. gpu=4); each gets "
                                    "MONARCH_RANK_<DIM> and MONARCH_SIZE_<DIM> for every dimension.")
        subparser.add_argument("-e", "--env", action="append", default=[],
                               help="Extra environment variable KEY=VALUE (repeatable)")
        subparser.add_argument("--workdir", type=str, default=None, help="Working directory on the hosts")
        subparser.add_argument("--kill", action="store_true", default=False,
                               help="Release the job when the command ends")
        subparser.add_argument("--script", type=str, default=None, help="Run this bash script ('-': stdin)")
        subparser.add_argument("-m", dest="module", default=None, metavar="MODULE",
                               help="Run a Python module, as python -m MODULE")
        subparser.add_argument("cmd", nargs=argparse.REMAINDER, help="The command to run")

    def run(self, args: argparse.Namespace) -> None:
        cmd = list(args.cmd)
        if cmd[:1] == ["--"]:
            cmd = cmd[1:]
        if args.module:
            cmd = ["-m", args.module, *cmd]
        if not cmd and args.script is None:
            raise _Refused("no command specified (use cmd args or --script)")
        per_host = None
        if args.per_host:
            dim, sep, n = args.per_host.partition("=")
            if not sep or not dim.strip() or not n.strip().isdigit() or int(n) < 1:
                raise _Refused(f"--per-host expects DIM=N with N >= 1, got {args.per_host!r}")
            per_host = {dim.strip(): int(n)}
        rc = exec_on_job(cmd, run_all=args.run_all, mesh_name=args.mesh, point_str=args.point,
                         env=args.env or None, workdir=args.workdir, kill=args.kill, script=args.script,
                         per_host=per_host)
        if rc != 0:
            sys.exit(rc)


class ShellCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("--mesh", type=str, default=None, metavar="NAME",
                               help="The mesh whose host the shell runs on (default: the first)")
        subparser.add_argument("--point", type=str, default=None, metavar="DIM=N,DIM=N",
                               help="The host's coordinate (default: rank 0)")
        subparser.add_argument("-e", "--env", action="append", default=[],
                               help="Extra environment variable KEY=VALUE (repeatable)")
        subparser.add_argument("--workdir", type=str, default=None, help="Where the shell starts on the host")
        subparser.add_argument("--kill", action="store_true", default=False,
                               help="Release the job when the shell exits")

    def run(self, args: argparse.Namespace) -> None:
        rc = shell_on_job(mesh_name=args.mesh, point_str=args.point, env=args.env or None,
                          workdir=args.workdir, kill=args.kill)
        if rc != 0:
            sys.exit(rc)


class KillCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("name", nargs="?", default=None,
                               help="The context whose job to release (default: the active one)")

    def run(self, args: argparse.Namespace) -> None:
        print(kill_context(args.name), flush=True)


def _load_job() -> Any:
    from monarch.job import job_load

    try:
        return job_load()
    except FileNotFoundError:
        raise _Refused("no active job was found in this context; run 'monarch apply' first") from None


class QueryCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("sql", nargs="?", default=None, help="SQL, or '-' to read it from stdin")
        subparser.add_argument("-f", "--file", dest="sql_file", type=Path, default=None, help="Read SQL from a file")
        subparser.add_argument("--format", dest="output_format", choices=("table", "json", "jsonl"),
                               default="table", help="Output format (default: table)")
        subparser.add_argument("--timeout", type=_parse_duration, default=None,
                               help=f"How long to wait for the hosts, e.g. 30s (default: {DEFAULT_QUERY_TIMEOUT_SEC:g}s)")

    @staticmethod
    def _read_sql(args: argparse.Namespace) -> str:
        if args.sql is not None and args.sql_file is not None:
            raise _Refused("pass SQL or --file, not both")
        if args.sql_file is not None:
            sql = args.sql_file.read_text(encoding="utf-8")
        elif args.sql == "-" or (args.sql is None and not sys.stdin.isatty()):
            sql = sys.stdin.read()
        elif args.sql is not None:
            sql = args.sql
        else:
            raise _Refused("pass SQL, --file PATH, or pipe SQL on stdin")
        if not sql.strip():
            raise _Refused("SQL query is empty")
        return sql

    def run(self, args: argparse.Namespace) -> None:
        sql = self._read_sql(args)
        job = _load_job()
        timeout = args.timeout if args.timeout is not None else DEFAULT_QUERY_TIMEOUT_SEC
        if hasattr(job, "query"):  # a monarch reservation: every host's telemetry tables, always on
            rows = job.query(sql, timeout=timeout).to_pylist()
        else:
            rows = job.telemetry_query_client().query(sql).get("rows", [])
        if args.output_format == "json":
            out = json.dumps({"rows": rows}, indent=2, sort_keys=True, default=str)
        elif args.output_format == "jsonl":
            out = "\n".join(json.dumps(r, sort_keys=True, default=str) for r in rows)
        else:
            out = format_table(rows)
        if out:
            sys.stdout.write(out + "\n")


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows as an aligned text table ending with its row count (``(0 rows)`` when empty)."""
    count = f"({len(rows)} {'row' if len(rows) == 1 else 'rows'})"
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    if not columns:
        return count

    def text(v: Any) -> str:
        if v is None:
            return "NULL"
        return json.dumps(v, separators=(",", ":"), sort_keys=True, default=str) if isinstance(v, (dict, list)) else str(v)

    cells = [[text(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = lambda vals: " | ".join(v.ljust(widths[i]) for i, v in enumerate(vals)).rstrip()  # noqa: E731
    return "\n".join([line(columns), "-+-".join("-" * w for w in widths), *(line(r) for r in cells), count])


class ProfileCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("source", nargs="?", default=None,
                               help="A mesh-admin URL, or 'mast' (Meta-internal); default: the active job")
        subparser.add_argument("mast_job", nargs="?", default=None, help="The MAST job after 'mast'")
        subparser.add_argument("--time", default="10s", dest="duration", type=_parse_duration,
                               help="How long to record (default: 10s)")
        subparser.add_argument("-o", "--output", type=Path, default=None,
                               help="Where to write the trace (default: /tmp/$USER/monarch_profiles/)")
        subparser.add_argument("--role-name", type=str, default=None, help="MAST role (Meta-internal)")
        subparser.add_argument("--dashboard-port", type=int, default=_DEFAULT_DASHBOARD_PORT,
                               help="Dashboard port of a MAST target (Meta-internal)")

    def run(self, args: argparse.Namespace) -> None:
        from monarch._workbench.profile import collect
        from monarch_agents.files import write_atomic

        if args.source == "mast" or args.mast_job is not None:
            raise _Refused("profiling a MAST job is only available in Meta-internal builds")
        if args.source is not None:
            raise _Refused("profile reads the active job's telemetry here, not a mesh-admin URL; "
                           "run it without SOURCE in the job's directory")
        job = _load_job()
        record = getattr(job._running, "record", None)
        if record is None:
            raise _Refused("the active job is not a monarch reservation with telemetry")
        sys.stderr.write(f"Collecting traces for {args.duration:g}s...\n")
        start_us = time.time_ns() // 1000
        time.sleep(args.duration)
        trace = collect(record, start_us, time.time_ns() // 1000)
        out = args.output
        if out is None:
            out = _profiles_folder() / f"trace_{time.strftime('%Y%m%d_%H%M%S')}.json"
        write_atomic(str(Path(out).absolute()), json.dumps(trace.to_json()).encode())
        sys.stdout.write(f"{out}\n")


def _profiles_folder() -> Path:
    """``/tmp/$USER/monarch_profiles`` (as Monarch's), made private: both folders are the user's and
    0700, or :class:`UnsafeFolder` says which is not (another user may have made ``/tmp/$USER``
    first, to read or swap what is written in it)."""
    from monarch_agents.files import private_dir

    folder = Path("/tmp") / os.environ.get("USER", str(os.getuid())) / "monarch_profiles"
    private_dir(str(folder), top=str(folder.parent))
    return folder


class TuiCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("--addr", "-a", required=True, help="Mesh admin server address")
        subparser.add_argument("--admin-port", type=int, default=None, help="Admin port override")
        subparser.add_argument("--refresh-ms", type=int, default=2000, help="Refresh interval in ms (default: 2000)")
        subparser.add_argument("--theme", choices=("nord", "doom-nord-light"), default="nord", help="Color theme")
        subparser.add_argument("--lang", choices=("en", "zh"), default="en", help="Display language")
        subparser.add_argument("--tls-ca", default=None, help="PEM CA certificate to verify the server")
        subparser.add_argument("--tls-cert", default=None, help="PEM client certificate (mutual TLS)")
        subparser.add_argument("--tls-key", default=None, help="PEM client private key (mutual TLS)")
        subparser.add_argument("--plaintext", action="store_true", help="Plain HTTP instead of TLS")
        subparser.set_defaults(_tui_subparser=subparser)

    def run(self, args: argparse.Namespace) -> None:
        if args.plaintext and any(p is not None for p in (args.tls_ca, args.tls_cert, args.tls_key)):
            args._tui_subparser.error("--plaintext cannot be used with --tls-ca, --tls-cert, or --tls-key")
        raise _Refused("Monarch's Rust admin TUI is not part of monarch; `monarch tui` (or `monarch dashboard`) "
                       "shows the reservation's hosts, procs, actors and ranks live")


class DebugCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.add_argument("--host", type=str, default=_get_debug_server_host(),
                               help="Host of the debug server")
        subparser.add_argument("--port", type=int, default=_get_debug_server_port(),
                               help="Port of the debug server")

    def run(self, args: argparse.Namespace) -> None:
        debug(args.host, args.port)


class DashboardCmd:
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        subparser.set_defaults(_dashboard_subparser=subparser)
        sub = subparser.add_subparsers(title="DASHBOARD COMMANDS", dest="dashboard_cmd")
        mast = sub.add_parser("mast", help="Relay a MAST job's dashboard (Meta-internal)")
        mast.add_argument("job", type=str, help="MAST job name")
        mast.add_argument("--role-name", type=str, default=None, help="The role that hosts the dashboard")
        mast.add_argument("--dashboard-port", type=int, default=_DEFAULT_DASHBOARD_PORT,
                          help="Dashboard port on the MAST task")
        mast.set_defaults(dashboard_func=self._run_mast)

    def run(self, args: argparse.Namespace) -> None:
        if not hasattr(args, "dashboard_func"):
            args._dashboard_subparser.print_help()
            sys.exit(1)
        args.dashboard_func(args)

    def _run_mast(self, args: argparse.Namespace) -> None:
        raise _Refused("`dashboard mast` is only available in Meta-internal builds; `monarch dashboard` "
                       "serves this reservation's")


def _load_skill_md() -> str:
    """The guide printed after the subcommands in ``--help`` (``monarch/tools/SKILL.md``)."""
    return importlib.resources.files("monarch.tools").joinpath("SKILL.md").read_text(encoding="utf-8")


def get_parser() -> argparse.ArgumentParser:
    """Monarch's argument parser: every subcommand, its arguments, and ``func`` to run it."""
    parser = argparse.ArgumentParser(description="Monarch CLI: run code on remote workers",
                                     epilog=_load_skill_md(), formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(title="COMMANDS")
    context = ContextCmd()
    context_parser = subparsers.add_parser("context", help="Manage job contexts")
    context.add_arguments(context_parser)
    context_parser.set_defaults(func=context.run, _subparser=context_parser)
    for name, cmd, text in [
        ("apply", ApplyCmd(), "Reserve workers for a job object (e.g. myjob.job)"),
        ("exec", ExecCmd(), "Run a command on workers (MONARCH_RANK_<DIM>/MONARCH_SIZE_<DIM> set per rank)"),
        ("shell", ShellCmd(), "Open an interactive shell on one worker"),
        ("kill", KillCmd(), "Release the active job"),
        ("query", QueryCmd(), "Run SQL over the job's telemetry"),
        ("profile", ProfileCmd(), "Record a Perfetto trace of the active job"),
        ("tui", TuiCmd(), "Inspect a mesh in a terminal UI"),
        ("debug", DebugCmd(), "Connect to the debug server"),
        ("dashboard", DashboardCmd(), "Serve Monarch dashboards"),
    ]:
        p = subparsers.add_parser(name, help=text)
        cmd.add_arguments(p)
        p.set_defaults(func=cmd.run)
    return parser


def main(argv: list[str] = sys.argv[1:]) -> None:  # noqa: B006 - Monarch's signature
    """Run Monarch's CLI on ``argv``: modules of the working directory import (``apply myjob.job``)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    parser = get_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        sys.exit(1)
    from monarch.errors import MonarchError

    try:
        args.func(args)
    except _Refused as e:
        _fail(str(e), 1)
    except MonarchError as e:  # monarch's own errors are one line with their fix, and their exit code
        _fail(str(e), e.exit_code)
    except (FileNotFoundError, ValueError, RuntimeError, TypeError, AttributeError, ImportError, OSError) as e:
        _fail(f"{type(e).__name__}: {e}", 1)
    finally:
        _shutdown()


def _fail(text: str, code: int) -> None:
    print(f"monarch: {text}", file=sys.stderr)
    sys.exit(code)


def _shutdown() -> None:
    """Stop this client's procs and close its connections (a no-op when it made none)."""
    from monarch.actor import shutdown_context

    shutdown_context().get()


if __name__ == "__main__":
    main()
