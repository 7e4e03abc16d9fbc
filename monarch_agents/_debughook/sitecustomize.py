"""Runs at the start of every Python a host agent starts (this folder is on its ``PYTHONPATH``).

It routes ``pdb.set_trace()`` (and, under ``monarch run --pdb``, uncaught exceptions) to
``monarch debug``; ``breakpoint()`` goes there through ``PYTHONBREAKPOINT`` alone.  Costs a
few hundred microseconds, and then runs the ``sitecustomize`` this one hides, if any.
"""

import os
import sys


def _install() -> None:
    if not os.environ.get("MONARCH_DEBUG_SOCK"):
        return
    try:
        import monarch_breakpoint

        monarch_breakpoint.install()
    except Exception as e:  # never stop the user's program over the debugger
        sys.stderr.write(f"monarch: debug hook not installed: {e}\n")


def _chain() -> None:
    """Run the sitecustomize this one shadows (e.g. Debian's), as Python would have."""
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()
