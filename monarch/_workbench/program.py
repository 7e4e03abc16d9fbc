"""Runs an actor program as ``python prog.py`` would, for ``monarch run prog.py``.

    python -m monarch._workbench.program prog.py ARGS...

The same ``sys.argv``, ``sys.path[0]`` (the program's folder) and ``__main__``; the one difference
is Ctrl-C: an uncaught KeyboardInterrupt ends the program with exit code 130 (its ``finally``
blocks and atexit handlers run) instead of a traceback, as ``monarch run -- CMD`` ends; one that
the default ``unhandled_fault_hook`` raised (a failure no one handled) ends it with code 1.  An
uncaught exception's traceback starts in the program, as Python's own does.

The program ends with the ``monarch run`` that started it, however that ended (``kill -9`` too):
``MONARCH_PROGRAM_LIFELINE`` names a pipe whose other end only that client holds; at its end of
file the program gets SIGTERM, then SIGKILL after a grace.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

LIFELINE_ENV = "MONARCH_PROGRAM_LIFELINE"
#: How long a program whose client is gone has between SIGTERM and SIGKILL.
_ORPHAN_GRACE_S = 2.0


def _watch_lifeline(fd: int) -> None:
    def watch() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass  # read as end of file: the client is gone either way
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_ORPHAN_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="monarch-run-lifeline", daemon=True).start()


def main() -> None:
    fd = os.environ.pop(LIFELINE_ENV, "")
    if fd.isdigit():
        _watch_lifeline(int(fd))
    if len(sys.argv) < 2:
        sys.exit("usage: python -m monarch._workbench.program PROGRAM.py [ARGS...]")
    path = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except KeyboardInterrupt:
        from monarch_agents import supervision

        # The default unhandled_fault_hook's interrupt is a failure, not Ctrl-C: Monarch documents
        # that it exits with code 1 (the failure is already on stderr).
        sys.exit(1 if supervision.ended_by_fault() else 130)
    except Exception as e:
        # As `python prog.py` shows it: the traceback starts in the program, not in runpy and here.
        tb = _from_program(e.__traceback__, path)
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)


def _from_program(tb, path: str):
    """``tb`` from the program's first frame on (all of it if the program has none)."""
    want = os.path.abspath(path)
    t = tb
    while t is not None and os.path.abspath(t.tb_frame.f_code.co_filename) != want:
        t = t.tb_next
    return t if t is not None else tb


if __name__ == "__main__":
    main()
