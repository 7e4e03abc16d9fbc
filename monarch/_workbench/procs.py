"""Act on one proc agent of a reservation from any client (the dashboard's "kill proc")."""

from __future__ import annotations

import signal

from monarch.errors import MonarchError
from monarch._workbench.state import JobRecord


def kill_proc(record: JobRecord, host: str, pid: int, signum: int = signal.SIGKILL, timeout_s: float = 5.0) -> bool:
    """Signal proc agent ``pid`` on ``host``; its owner sees it die as any proc death. False: no such live proc there."""
    from monarch_agents import messages as m

    target = next((h for h in record.hosts if h.host == host), None)
    if target is None:
        raise MonarchError(f"no host {host!r} in the reservation")
    rt = record.runtime()
    return bool(rt.request(target.addr, lambda port: m.KillProc(pid, signum, port)).get(timeout=timeout_s))
