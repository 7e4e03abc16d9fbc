"""The ``monarch`` command's entry point: the lean ``monarch run``/``sync``/``query`` first, else the Click app.

``monarch run -- CMD`` is typed again and again, and Python starts afresh each time: what it
imports before the run starts is most of its cost.  A plain ``monarch run`` command line (the
options it takes every day, see :mod:`monarch_cli.lean`) therefore skips Click, Rich and the
other commands altogether and goes straight to the same run code the Click command calls; every
other command line (help, --json, a typo, a script.py, any other command) goes to the Click app
in :mod:`monarch_cli.app`, which gives its help text and its errors.  Both end through the same
exit-code table.  ``monarch sync`` (an edit pushed) and ``monarch query SQL`` take the same lean
path, and the same warm runner (:mod:`monarch_cli.warm`).
"""

from __future__ import annotations

import sys


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(f"warning: {message}\n")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: every way out goes through one exit-code table.

    ``argv`` None: this process is the command (the console script, ``python -m``), and a lean run
    ends it without the interpreter's teardown (:func:`_exit_now`); given (a caller in-process,
    tests), it ends with ``SystemExit`` as any command does."""
    own_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if own_process:
        from monarch_cli.warm import enabled, warm_run

        if enabled(argv):
            code = warm_run(argv)  # a child of the warm runner ran it (None: it is ours to run)
            if code is not None:
                _exit_now(code)
    import warnings

    warnings.showwarning = _one_line_warning
    from monarch._workbench import command_process

    command_process()  # this process hears only its host agents (an actor program runs in a child)
    try:
        from monarch_cli.lean import lean_command

        code = lean_command(argv)
        lean = code is not None
        if code is None:
            from monarch_cli.app import run_app

            code = run_app(argv)
    finally:
        command_process(False)  # main() called in-process (tests) leaves later runtimes as they were
    if lean and own_process:
        _exit_now(code)
    sys.exit(code)


def _exit_now(code: int) -> None:
    """End this process with ``code`` without tearing the interpreter down: freeing every module and
    object costs a finished ``monarch run`` 5-10 ms it has no use for.  What must happen at exit still
    does: the atexit functions (messages still queued to the hosts leave, logging flushes), then
    stdout and stderr are flushed.  A thread the interpreter would wait for: the usual exit."""
    import atexit
    import os
    import threading

    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader gone: nothing left to say it on
            pass
    os._exit(code)


def __getattr__(name: str):
    # `monarch_cli.main.app` (and the rest of the Click app) as before the lean entry point.  Never
    # for dunder names: the import system asks for `__path__` and the like, and must not load Click.
    if name.startswith("__"):
        raise AttributeError(f"module 'monarch_cli.main' has no attribute {name!r}")
    import monarch_cli.app

    try:
        return getattr(monarch_cli.app, name)
    except AttributeError:
        raise AttributeError(f"module 'monarch_cli.main' has no attribute {name!r}") from None


if __name__ == "__main__":
    main()
