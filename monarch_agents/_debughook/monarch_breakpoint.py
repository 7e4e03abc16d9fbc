"""``PYTHONBREAKPOINT=monarch_breakpoint.set_trace``: the rank side of ``monarch debug``.

This folder is put on the ``PYTHONPATH`` of every command a host agent runs, so that
the user's Python (which may not have monarch installed) finds the hook.  The code
lives in ``monarch_agents/debug_rank.py``; this shim loads it by path when
``monarch_agents`` is not importable.
"""

import os
import sys

try:
    from monarch_agents import debug_rank as _impl
except ImportError:
    import importlib.util

    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "debug_rank.py")
    _spec = importlib.util.spec_from_file_location("monarch_debug_rank", _path)
    _impl = importlib.util.module_from_spec(_spec)
    sys.modules["monarch_debug_rank"] = _impl
    _spec.loader.exec_module(_impl)

set_trace = _impl.set_trace
post_mortem = _impl.post_mortem
install = _impl.install
