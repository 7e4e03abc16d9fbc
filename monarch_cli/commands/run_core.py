"""What ``monarch run`` does, without Click: shared by the Click command (monarch_cli/commands/run.py)
and the lean entry point (monarch_cli/lean.py), so both print and exit alike."""

from __future__ import annotations

import os
import sys
from typing import Iterable

from monarch.errors import UsageError
from monarch_cli.output import err, escape, print_json


def run_main(argv: list[str], *, name: str | None = None, hosts: str | None = None, env: Iterable[str] = (),
             workdir: str | None = None, detach: bool = False, post_mortem: bool = False,
             warn_before: float | None = None, verbose: bool = False, as_json: bool = False) -> int:
    """Run ``argv`` on the reservation's hosts (or an actor program here) and return the exit code;
    a bad argument or a gone reservation raises (the caller's error handler words it)."""
    from monarch._workbench.reserve import load_live, time_warning_s
    from monarch._workbench.run import run_command, run_failure, select_hosts

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
        _push_workspace(record, verbose)
    _check_script_exists(argv[0], workdir)
    if argv[0].endswith(".py") and os.path.isfile(argv[0]) and not hosts:
        return _run_program(record, path, argv, extra, as_json)
    wanted = None
    if hosts:
        try:
            wanted = [int(x) for x in hosts.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--hosts expects ranks like 0,2, got {hosts!r}") from None
    selected = select_hosts(record, wanted)
    # --json: stdout holds the one document; the ranks' output goes to stderr.
    outcome = run_command(record, argv, hosts=selected, env=extra, cwd=workdir or os.getcwd(),
                          color=sys.stdout.isatty() and not as_json, all_to_stderr=as_json, detach=detach,
                          warn_before_s=warn_s, on_debug=_say_debug_waiting,
                          on_warning=lambda line: err.print(f"[yellow]warning:[/] {escape(line)}"))
    if detach:
        if as_json:
            print_json({"run_id": outcome.run_id, "detached": True})
        else:
            err.print(f"started run {outcome.run_id} on {len(selected)} host(s); "
                      f"`monarch logs --run {outcome.run_id} -f` follows it")
        return 0
    failure = run_failure(record, outcome)
    if as_json:
        print_json(outcome_doc(outcome, failure))
    if failure is not None and failure.interrupted:
        err.print(f"[yellow]{escape(failure.message)}[/]")
    elif failure is not None:
        err.print(f"[bold red]error:[/] {escape(failure.message)}")
        if failure.hint:
            err.print(f"  [dim]hint:[/] {escape(failure.hint)}")
        f = outcome.first_failure
        if verbose and f is not None:
            err.print(f"  first failure: rank {f.rank} on {f.host} {escape(f.reason)}")
    return int(outcome.exit_code)


def outcome_doc(outcome, failure) -> dict:
    """A finished run as --json's one document (`monarch run`, `monarch exec`)."""
    doc = {"run_id": outcome.run_id, "exit_code": outcome.exit_code,
           "ranks": [{"rank": r.rank, "host": r.host, "exit_code": r.exit_code, "reason": r.reason}
                     for r in outcome.results]}
    if failure is not None:
        doc.update(error=failure.message, hint=failure.hint)
    return doc


def _push_workspace(record, verbose: bool) -> None:
    """Changed files go to every host before the run starts there (a stat per file when nothing changed)."""
    from monarch._workbench.workspace import ReservationSync, describe

    results = ReservationSync(record).sync()
    if verbose or any(r.changed for r in results):
        err.print(f"[dim]{escape(describe(results, len(record.hosts)))}[/]")


def _say_debug_waiting(session: dict) -> None:
    """Once per debug session a rank opens: which rank waits, and the command that attaches."""
    from monarch._workbench.debug import waiting_line

    err.print(f"[yellow]{escape(waiting_line(session))}[/]")


def _run_program(record, state_path: str, argv: list[str], extra: dict, as_json: bool) -> int:
    """An actor program here (the engine's ``run_program``); with --json, its output goes to stderr."""
    from monarch._workbench.run import program_failure, run_program

    run_id, code = run_program(record, state_path, argv, extra,
                               stdout=sys.stderr.buffer if as_json else sys.stdout.buffer, stderr=sys.stderr.buffer)
    failure = program_failure(run_id, code)
    if as_json:
        doc = {"run_id": run_id, "kind": "program", "exit_code": code}
        if failure is not None:
            doc.update(error=failure.message, hint=failure.hint)
        print_json(doc)
    if failure is not None and failure.interrupted:
        err.print(f"[yellow]{escape(failure.message)}[/]")
    return code


def _check_script_exists(first: str, workdir: str | None) -> None:
    """`monarch run train.py` with no train.py here: say so, not that it is missing from the hosts' PATH."""
    if not first.endswith(".py"):
        return
    import shutil  # here: shutil costs ~2 ms, and most runs are not of a .py

    if shutil.which(first):
        return
    where = workdir if workdir and os.path.isdir(workdir) else os.getcwd() if not workdir else None
    if where is not None and not os.path.exists(os.path.join(where, first)):
        raise UsageError(f"{first}: no such file in {where}",
                         "`monarch run script.py` runs a Python file from this folder (or -w DIR); "
                         "`monarch run -- CMD` runs a command")
