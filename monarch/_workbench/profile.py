"""A window of a reservation's activity as a Chrome trace (trace-event JSON, opens in Perfetto).

Read from the telemetry tables every host keeps: run ranks and procs as spans over their
lifetimes, endpoint calls (``messages``) as spans of their latency, sends as instants.  One
process track per host, one thread track per rank, proc or actor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monarch.errors import UsageError


class NoTelemetry(UsageError):
    """The reservation has no telemetry for the window asked."""


@dataclass
class Trace:
    """Chrome trace events, and the track ids given to each host and thread name."""

    events: list[dict] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    tids: dict[tuple[int, str], int] = field(default_factory=dict)

    def track(self, host: str, thread: str) -> tuple[int, int]:
        if host not in self.pids:
            self.pids[host] = len(self.pids) + 1
            self.events.append({"ph": "M", "name": "process_name", "pid": self.pids[host], "args": {"name": host}})
        pid = self.pids[host]
        if (pid, thread) not in self.tids:
            self.tids[(pid, thread)] = len(self.tids) + 1
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": self.tids[(pid, thread)],
                                "args": {"name": thread}})
        return pid, self.tids[(pid, thread)]

    def span(self, host: str, thread: str, name: str, cat: str, start_us: int, end_us: int, **args: Any) -> None:
        pid, tid = self.track(host, thread)
        self.events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": start_us,
                            "dur": max(1, end_us - start_us), "args": args})

    def instant(self, host: str, thread: str, name: str, cat: str, ts_us: int, **args: Any) -> None:
        pid, tid = self.track(host, thread)
        self.events.append({"ph": "i", "s": "t", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts_us,
                            "args": args})

    def to_json(self) -> dict:
        return {"traceEvents": self.events, "displayTimeUnit": "ms"}


def _us(v: Any) -> int | None:
    if v is None:
        return None
    if hasattr(v, "timestamp"):
        return int(v.timestamp() * 1_000_000)
    return int(v)


def collect(record: Any, start_us: int, end_us: int, timeout_s: float = 10.0) -> Trace:
    """The reservation's activity between ``start_us`` and ``end_us`` (wall clock, microseconds)."""
    from monarch._workbench.telemetry import query

    def rows(sql: str) -> list[dict]:
        result = query(record, sql, row_limit=None, timeout_s=timeout_s)
        if result.missing_hosts and len(result.missing_hosts) >= len(record.hosts):
            raise NoTelemetry(f"no telemetry from this reservation: no host answered "
                              f"({'; '.join(sorted(set(result.errors.values()))) or 'no answer'})",
                              "`monarch status` shows which agents answer")
        return result.table.to_pylist()

    trace = Trace()
    for r in rows("SELECT run_id, rank, host, argv, pid, started, ended, exit_code FROM run_ranks"):
        s, e = _us(r["started"]), _us(r["ended"]) or end_us
        if s is None or e < start_us or s > end_us:
            continue
        trace.span(r["host"], f"rank {r['rank']}", r["argv"] or r["run_id"], "run", max(s, start_us), min(e, end_us),
                   run_id=r["run_id"], pid=r["pid"], exit_code=r["exit_code"])
    for r in rows("SELECT host, pid, kind, mesh, run_id, rank, status, started, ended FROM procs"):
        s, e = _us(r["started"]), _us(r["ended"]) or end_us
        if s is None or e < start_us or s > end_us:
            continue
        trace.span(r["host"], f"proc {r['pid']} ({r['kind']})", f"{r['kind']} {r['mesh'] or r['run_id'] or ''}".strip(),
                   "proc", max(s, start_us), min(e, end_us), status=r["status"], rank=r["rank"])
    actors = {r["id"]: r for r in rows("SELECT id, display_name, full_name, host, rank FROM actors_ext")}
    for r in rows(f"SELECT timestamp_us, to_actor_id, from_actor_id, endpoint, host, status, latency_us, queue_us "
                  f"FROM messages_ext WHERE timestamp_us >= {int(start_us)} AND timestamp_us <= {int(end_us)}"):
        a = actors.get(r["to_actor_id"], {})
        thread = f"actor {a.get('display_name') or r['to_actor_id']}"
        ts, lat = int(r["timestamp_us"]), int(r["latency_us"] or 0)
        trace.span(r["host"] or a.get("host") or "?", thread, r["endpoint"] or "message", "endpoint", ts, ts + lat,
                   status=r["status"], queue_us=r["queue_us"])
    for r in rows(f"SELECT timestamp_us, host, endpoint, adverb, num_targets, sender_actor_id FROM sent_messages_ext "
                  f"WHERE timestamp_us >= {int(start_us)} AND timestamp_us <= {int(end_us)}"):
        a = actors.get(r["sender_actor_id"], {})
        thread = f"actor {a.get('display_name') or r['sender_actor_id']}"
        trace.instant(r["host"] or "?", thread, f"{r['adverb'] or 'send'} {r['endpoint']}", "send",
                      int(r["timestamp_us"]), num_targets=r["num_targets"])
    if not any(e["ph"] != "M" for e in trace.events):
        raise NoTelemetry("no telemetry in this window: no run, proc or message was recorded",
                          "start a run (`monarch run -d ...`) or an actor program, then `monarch profile` while it works")
    return trace
