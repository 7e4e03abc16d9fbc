"""What a process holding a job's keys does to keep them from code running as the same user.

A rank, an actor, or anything else the user runs on a host has the agents' uid, so the kernel's
usual rules let it read ``/proc/<agent>/environ`` and ``/proc/<agent>/mem`` or attach a debugger:
the host agent's keys (the client's secret among them) would be one read away.  A process that is
not *dumpable* (``prctl(PR_SET_DUMPABLE, 0)``) has those files owned by root and refuses ptrace
from anyone without CAP_SYS_PTRACE.  Root still reads everything.

Procs are left dumpable on purpose: they hold only the proc key every rank holds anyway, and
``monarch stack`` (py-spy) and same-host RDMA reads (``process_vm_readv``) need to read them.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("monarch.hardening")

_PR_SET_DUMPABLE = 4


def not_dumpable() -> bool:
    """Make this process not dumpable (see the module docstring); False where the kernel would not."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
            return True
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed (errno %d): this agent's memory is readable by its uid",
                    ctypes.get_errno())
    except (OSError, AttributeError) as e:
        log.warning("no prctl here (%s): this agent's memory is readable by its uid", e)
    return False
