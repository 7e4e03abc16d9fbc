"""The runtime of a client process: the one that talks to a job's host agents.

Used by ``monarch.actor`` (a controller program) and by the CLI commands that
only send a few messages (``run``, ``status``, ``logs``, ``shell``); kept
outside ``monarch.actor`` so those commands do not import the actor API.
"""

from __future__ import annotations

import os
import threading

from monarch_agents import runtime as rt_mod
from monarch_agents import messages as m
from monarch_agents import supervision
from monarch_agents.keys import JobKeys
from monarch_agents.runtime import Runtime

_lock = threading.RLock()


def _job_keys() -> JobKeys | None:
    path = os.environ.get("MONARCH_RUN_JOB")
    if not path:
        return None
    from monarch.job.state import load_state

    return load_state(path).keys


def ensure_runtime(keys: JobKeys | None = None) -> Runtime:
    """This process's runtime, started on first use (with ``keys`` when it talks to a reservation)."""
    with _lock:
        rt = rt_mod.current()
        if rt is not None:
            if keys is not None and keys != rt.keys:
                raise RuntimeError("this process already talks to another monarch job; "
                                   "use one reservation per process (or load the job before calling this_host())")
            return rt
        keys = keys or _job_keys() or JobKeys.generate()
        bind = os.environ.get("MONARCH_BIND", "127.0.0.1")
        rt = Runtime(keys, bind_host=bind, name="client")
        supervision.install(rt)
        rt.register(m.ActorDebugWaiting, _debug_waiting)
        rt.start()
        rt_mod.install(rt)
        return rt


def _debug_waiting(msg: m.ActorDebugWaiting) -> None:
    """An actor of this program stopped in breakpoint(): say so once, on stderr."""
    import sys

    from monarch_agents.services.debug import waiting_line

    sys.stderr.write(f"{waiting_line(msg.session)}\n")
    sys.stderr.flush()


rt_mod.factory = ensure_runtime
