"""A reservation's host agents, asked directly: who is up (and what runs there), and a run's log.

The engine behind ``monarch status`` and ``monarch logs``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from monarch_agents import messages as m
from monarch._workbench.state import HostRecord, JobRecord


@dataclass
class AgentStatus:
    """One host agent's answer to a ping: ``info`` when it answered, else ``error`` (one line)."""

    host: HostRecord
    info: m.HostInfo | None = None
    error: str = ""

    @property
    def up(self) -> bool:
        return self.info is not None


def ping_agents(record: JobRecord, timeout: float) -> list[AgentStatus]:
    """Ping every host agent of ``record`` at once; all answers (or failures) within ``timeout`` seconds."""
    rt = record.runtime()
    t0 = time.monotonic()
    futures = [(h, rt.request(h.addr, lambda port: m.Ping(port))) for h in record.hosts]
    out = []
    for h, f in futures:
        try:
            out.append(AgentStatus(h, f.get(timeout=max(0.1, timeout - (time.monotonic() - t0)))))
        except Exception as e:
            out.append(AgentStatus(h, error=(str(e).splitlines() or [type(e).__name__])[0]))
    return out


def read_log(record: JobRecord, host: HostRecord, run_id: str, stream: str, offset: int,
             timeout: float = 5.0) -> dict[int, tuple[bytes, bool]]:
    """Bytes of ``stream`` ("stdout"/"stderr") of run ``run_id`` on ``host`` from ``offset``, per rank it
    ran there, each with whether that rank has finished (its log is complete)."""
    rt = record.runtime()
    return rt.request(host.addr, lambda port: m.ReadLog(run_id, stream, offset, port)).get(timeout=timeout)
