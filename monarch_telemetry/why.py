"""``monarch why``: the root failure of the last run, from the tables, and what failed because of it.

The root is the earliest failure: the first rank of the last run to exit non-zero
(``rank_exits``), or the first actor to fail (``actor_status_events``) if that came
sooner.  Its exception is the last exception line its rank printed (``logs``), shown with
the lines before it.  The consequences are the other ranks that failed after it (the run
stops the others once one fails: they end by a signal) and actors that failed later.

What it does not do: guess beyond the tables (a rank that printed nothing has no exception here).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import pyarrow as pa

#: Log lines shown with the root failure.
LOG_TAIL = 20
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning)\b(?::.*)?$")


@dataclass
class Failure:
    """One failure: a rank that exited non-zero, or an actor that failed."""

    kind: str  # "rank" | "actor"
    host: str
    time: Any
    reason: str | None
    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    actor: str | None = None
    exception: str | None = None
    log_tail: list[str] = field(default_factory=list)


@dataclass
class Why:
    """The answer: the last run, its root failure, and the failures that followed."""

    run_id: str | None
    argv: str | None
    status: str
    root: Failure | None
    consequences: list[Failure] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        return _jsonable(d)


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def explain(query: Callable[[str], pa.Table]) -> Why:
    """Answer "why did the last run fail" with ``query(sql) -> pyarrow.Table`` over the job's tables."""
    runs = query("SELECT run_id, argv, status, started FROM runs ORDER BY started DESC LIMIT 1").to_pylist()
    run = runs[0] if runs else None
    since = f"WHERE e.timestamp_us >= {int(run['started'].timestamp() * 1e6)}" if run else ""
    actor_fails = query(
        "SELECT e.timestamp_us, e.reason, a.display_name, a.full_name, a.host, a.rank "
        "FROM actor_status_events e LEFT JOIN actors_ext a ON e.actor_id = a.id "
        f"{since}{' AND' if since else 'WHERE'} e.new_status = 'Failed' ORDER BY e.timestamp_us").to_pylist()
    actors = [Failure("actor", r["host"] or "", _us_to_time(r["timestamp_us"]), r["reason"], rank=r["rank"],
                      actor=r["display_name"] or r["full_name"], exception=_first_line(r["reason"]))
              for r in actor_fails]
    ranks: list[Failure] = []
    if run is not None:
        exits = query(f"SELECT rank, host, exit_code, signal, reason, time FROM rank_exits "
                      f"WHERE run_id = {_q(run['run_id'])} AND exit_code <> 0 ORDER BY time, rank").to_pylist()
        ranks = [Failure("rank", r["host"], r["time"], r["reason"], rank=r["rank"], exit_code=r["exit_code"],
                         signal=r["signal"]) for r in exits]
    failures = sorted(ranks + actors, key=lambda f: (_sort_key(f.time), f.kind != "rank"))
    status = run["status"] if run else ("failed" if actors else "no runs")
    if not failures:
        return Why(run["run_id"] if run else None, run["argv"] if run else None, status, None)
    root, rest = failures[0], failures[1:]
    if root.kind == "rank" and run is not None:
        lines = query(f"SELECT stream, line FROM logs WHERE run_id = {_q(run['run_id'])} AND rank = {int(root.rank)} "
                      f"ORDER BY time DESC LIMIT 200").to_pylist()
        lines.reverse()
        root.exception = _last_exception([r["line"] for r in lines if r["stream"] == "stderr"]) or \
            _last_exception([r["line"] for r in lines])
        root.log_tail = [r["line"] for r in lines[-LOG_TAIL:]]
    return Why(run["run_id"] if run else None, run["argv"] if run else None, status or "failed", root, rest)


def _last_exception(lines: list[str]) -> str | None:
    for line in reversed(lines):
        text = line.strip()
        if _EXCEPTION.match(text):
            return text
    return None


def _first_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return _last_exception(lines) or (lines[-1] if lines else None)


def _us_to_time(us: int | None) -> Any:
    import datetime as dt

    return None if us is None else dt.datetime.fromtimestamp(us / 1e6, dt.timezone.utc)


def _sort_key(t: Any) -> float:
    return t.timestamp() if t is not None else float("inf")
