"""The one place errors become what the user sees: one red line, the hint, an exit code.

Exit codes (each has a test in tests/cli/test_errors.py):

    0  success
    1  a run's command failed (its own exit code is passed through when possible)
    2  bad usage (UsageError, or Click's own usage errors)
    3  no reservation / unusable state file (StateError)
    4  the scheduler refused or failed (SchedulerError)
    5  a host agent is unreachable (AgentError)
    6  a run could not start (RunError)
  7  the workspace could not be synced (WorkspaceError)
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import sys
import traceback

import click

from monarch.errors import MonarchError
from monarch_cli.output import err as err_console
from monarch_cli.output import escape as _escape

EXIT_CODES = {
    "ok": 0,
    "failed": 1,
    "usage": 2,
    "state": 3,
    "scheduler": 4,
    "agent": 5,
    "run": 6,
    "workspace": 7,
    "interrupted": 130,
}


def fail(e: BaseException, verbose: bool = False) -> "click.exceptions.Exit":
    """Print ``e`` as one line (plus hint) and return the Exit to raise."""
    if isinstance(e, MonarchError):
        err_console.print(f"[bold red]error:[/] {_escape(e.message)}")
        if e.hint:
            err_console.print(f"  [dim]hint:[/] {_escape(e.hint)}")
        code = e.exit_code
    elif isinstance(e, KeyboardInterrupt):
        err_console.print("[yellow]interrupted[/]")
        code = EXIT_CODES["interrupted"]
    else:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        err_console.print(f"[bold red]error:[/] {type(e).__name__}{': ' + _escape(first) if first else ''}")
        if not verbose:
            err_console.print("  [dim]hint:[/] run again with --verbose for details")
        code = EXIT_CODES["failed"]
    if verbose:
        # No local variables: keys live in locals.
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    return click.exceptions.Exit(code)
