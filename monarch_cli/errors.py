"""The one place errors become what the user sees: one red line, the hint, an exit code.

The exit codes are one table, ``monarch.errors.ExitCode`` (listed by ``monarch --help``), and
each has an end-to-end test in tests/cli/test_exit_codes.py.  With ``--json`` an error is the
one JSON document on stdout, ``{"error": ..., "hint": ..., "exit_code": ...}``, and the red
line still goes to stderr for the person watching.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from typing import TYPE_CHECKING

from monarch.errors import ExitCode, MonarchError, UnsafeFolder
from monarch_cli.output import err as err_console
from monarch_cli.output import escape as _escape
from monarch_cli.output import print_json

if TYPE_CHECKING:
    import click


def fail(e: BaseException, verbose: bool = False, as_json: bool = False) -> click.exceptions.Exit:
    """Print ``e`` as one line (plus hint) and return the Exit to raise."""
    import click

    return click.exceptions.Exit(report(e, verbose, as_json))


def report(e: BaseException, verbose: bool = False, as_json: bool = False) -> int:
    """Print ``e`` as one line (plus hint) and return its exit code (no Click: the lean ``monarch run``'s)."""
    from monarch.errors import missing_part

    missing = missing_part(e)
    if isinstance(e, MonarchError):
        message, hint, code = e.message, e.hint, int(e.exit_code)  # a run passes its rank's status on: not only the table's
    elif missing is not None:
        (message, hint), code = missing, ExitCode.USAGE
    elif isinstance(e, UnsafeFolder):
        message, hint, code = e.message, e.hint, int(ExitCode.STATE)
    elif isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        # A full disk is the user's to fix, not a bug of ours: where, and how to see it.
        where = os.path.dirname(str(e.filename)) if e.filename else ""
        message = f"{e.strerror}" + (f" writing {e.filename}" if e.filename else "")
        hint, code = f"free space there (`df -h {where or '.'}`) and run again; nothing was left half-written", ExitCode.FAILED
    elif type(e).__name__ == "ConfigValueError":  # monarch.config's: a setting of the wrong form
        message, hint, code = str(e), "fix or unset it (`monarch.config`'s docstring lists the settings)", ExitCode.USAGE
    elif isinstance(e, KeyboardInterrupt):
        message, hint, code = "interrupted", "", ExitCode.INTERRUPTED
    else:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        message = f"{type(e).__name__}{': ' + first if first else ''}"
        hint = "" if verbose else "run again with --verbose for details"
        code = ExitCode.FAILED
    _report(message, hint, code, as_json)
    if verbose and not isinstance(e, KeyboardInterrupt):
        # No local variables: keys live in locals.
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    return int(code)


def report_click_error(e: click.ClickException, as_json: bool) -> int:
    """A usage error Click found (unknown option, missing argument): Click's words, our table."""
    import click

    code = ExitCode.USAGE if isinstance(e, click.UsageError) else ExitCode.FAILED
    if as_json:
        hint = ""
        ctx = getattr(e, "ctx", None)
        if ctx is not None:
            hint = f"`{ctx.command_path} --help` lists what it takes"
        print_json({"error": e.format_message(), "hint": hint, "exit_code": int(code)})
    e.show()
    return int(code)


def _report(message: str, hint: str, code: int, as_json: bool) -> None:
    if as_json:
        print_json({"error": message, "hint": hint, "exit_code": int(code)})
    if code == ExitCode.INTERRUPTED:
        err_console.print(f"[yellow]{_escape(message)}[/]")
    else:
        err_console.print(f"[bold red]error:[/] {_escape(message)}")
    if hint:
        err_console.print(f"  [dim]hint:[/] {_escape(hint)}")
