"""A reservation's host agents, asked directly: who is up (and what runs there), and a run's log.

The engine behind ``monarch status`` and ``monarch logs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents.fanout import FanoutCall, fan_out
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


#: What a message sent through :func:`fan_out_hosts` names as its answer port: the tree gives it one.
NO_PORT = m.PortRef("", 0)
#: How long past its own deadline a fan-out is waited for (its nodes answer by then, or say why not).
_FANOUT_GRACE_S = 1.0


def fan_out_hosts(record: JobRecord, hosts: list[HostRecord], make: Callable[[int, HostRecord], Any], *,
                  timeout_s: float | None, on_result: Callable[[int, tuple], None] | None = None) -> FanoutCall:
    """Send ``make(index, host)`` to each of ``hosts`` through the reservation's tree of host agents
    (``monarch_agents.fanout``): answers by index as ``(ok, value or why)``.  A pod's host agent
    holds no client key, so it could not forward: a Kubernetes reservation is asked straight."""
    targets = [(h.addr, h.host, make(i, h)) for i, h in enumerate(hosts)]
    direct = True if record.spec.scheduler == "kubernetes" else None
    return fan_out(record.runtime(), targets, timeout_s=timeout_s, on_result=on_result, direct=direct)


def ask_hosts(record: JobRecord, hosts: list[HostRecord], make: Callable[[int, HostRecord], Any],
              timeout_s: float) -> list[tuple]:
    """:func:`fan_out_hosts` and wait: one ``(ok, value or why)`` per host, in order."""
    call = fan_out_hosts(record, hosts, make, timeout_s=timeout_s)
    call.wait(timeout_s + _FANOUT_GRACE_S)
    results = dict(call.results)
    return [results.get(i, (False, f"no answer within {timeout_s:g} s")) for i in range(len(hosts))]


def ping_agents(record: JobRecord, timeout: float) -> list[AgentStatus]:
    """Ping every host agent of ``record`` at once; all answers (or failures) within ``timeout`` seconds."""
    hosts = list(record.hosts)
    out = []
    for h, (ok, value) in zip(hosts, ask_hosts(record, hosts, lambda i, h: m.Ping(NO_PORT), timeout)):
        if ok and isinstance(value, m.HostInfo):
            out.append(AgentStatus(h, value))
        else:
            out.append(AgentStatus(h, error=str(value) if not ok else f"unexpected answer {type(value).__name__}"))
    return out


def read_log(record: JobRecord, host: HostRecord, run_id: str, stream: str, offset: int,
             timeout: float = 5.0) -> dict[int, tuple[bytes, bool]]:
    """Bytes of ``stream`` ("stdout"/"stderr") of run ``run_id`` on ``host`` from ``offset``, per rank it
    ran there, each with whether that rank has finished (its log is complete)."""
    rt = record.runtime()
    return rt.request(host.addr, lambda port: m.ReadLog(run_id, stream, offset, port)).get(timeout=timeout)
