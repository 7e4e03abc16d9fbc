"""Ask every host agent of a reservation about its telemetry: the client side of ``monarch query``.

:func:`query` plans the SQL here (a bad query fails before any host is asked), sends
each host agent the scans it must run over its own rows, waits for them all against
one deadline, and finishes the query over every host's rows.  A host that does not
answer in time is listed in ``missing_hosts`` (``strict=True`` makes that an error).
:func:`stacks` and :func:`save` fan out the same way for ``monarch stack`` and
``monarch stop --save``.

What it does not do: print (the CLI does), or keep rows (host agents do).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from monarch.errors import AgentError, QueryError
from monarch._workbench.state import HostRecord, JobRecord

if TYPE_CHECKING:
    import pyarrow as pa

#: How long hosts get to answer a query by default (seconds).
DEFAULT_TIMEOUT_S = 10.0
#: Hosts stop their scans this much before the asker stops waiting, so a slow host says so.
_HOST_MARGIN = 0.8


@dataclass
class QueryResult:
    """A query's answer: the rows, the hosts that did not answer, and whether rows were cut off."""

    table: "pa.Table"
    missing_hosts: list[str] = field(default_factory=list)
    limited: bool = False
    row_limit: int | None = None
    #: Why each missing host is missing, in words.
    errors: dict[str, str] = field(default_factory=dict)


def _fan_out(record: JobRecord, make: Callable[[Any], Any], timeout_s: float,
             hosts: list[HostRecord] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Send ``make(port)`` to every host (through the tree of host agents); ({host: answer}, {host: why it gave none})."""
    from monarch._workbench.hosts import NO_PORT, ask_hosts

    targets = sorted(hosts if hosts is not None else record.hosts, key=lambda h: h.host_rank)
    answers: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for h, (ok, value) in zip(targets, ask_hosts(record, targets, lambda i, h: make(NO_PORT), timeout_s)):
        if ok:
            answers[h.host] = value
        else:
            errors[h.host] = str(value)
    return answers, errors


def query(record: JobRecord, sql: str, *, row_limit: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
          strict: bool = False, host_timeout_s: float | None = None) -> QueryResult:
    """Run ``sql`` over the telemetry of every host of ``record``; ``host_timeout_s`` (at most
    ``timeout_s``) bounds the wait for the hosts' scans alone, a host slower than it left out."""
    from monarch_agents.messages import TelemetryScan
    from monarch_telemetry.table import from_ipc

    p = _plan(sql, row_limit)
    parts: dict[str, list] = {t: [] for t in p.scans}
    errors: dict[str, str] = {}
    if p.needs_hosts:
        wait = timeout_s if host_timeout_s is None else max(0.0, min(timeout_s, host_timeout_s))
        host_timeout = max(0.05, wait * _HOST_MARGIN)
        answers, errors = _fan_out(record, lambda port: TelemetryScan(p.scans, host_timeout, port), wait)
        for host, answer in answers.items():
            bad = {t: v for t, v in answer.items() if isinstance(v, str)}
            if bad:
                errors[host] = next(iter(bad.values()))
                continue
            for table, data in answer.items():
                if table in parts:
                    parts[table].append(from_ipc(data))
    # Actor programs (`monarch run prog.py`) run here, not under a host agent: their rows come
    # from the job folder, so `runs`, `why` and the dashboard see them beside the commands.
    deadline = time.monotonic() + timeout_s
    for name, table in program_tables(record, [t for t in p.scans if t in _PROGRAM_TABLES]).items():
        from monarch_telemetry import engine

        parts[name].append(_scan(engine, name, table, p.scans[name], deadline))
    missing = [h.host for h in sorted(record.hosts, key=lambda h: h.host_rank) if h.host in errors]
    if missing and strict:
        raise AgentError(f"{len(missing)} host(s) did not answer: " + "; ".join(f"{h}: {errors[h]}" for h in missing),
                         "`monarch status` checks every agent; without --strict the answer covers the others")
    table, limited = _finish(p, parts, timeout_s)
    return QueryResult(table, missing, limited, row_limit, {h: errors[h] for h in missing})


def query_saved(directory: str, sql: str, *, row_limit: int | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> QueryResult:
    """Run ``sql`` over telemetry saved by ``monarch stop --save DIR``."""
    from monarch_telemetry import engine, parquet

    try:
        tables = parquet.load(directory)
    except FileNotFoundError as e:
        raise QueryError(str(e), "save with `monarch stop --save DIR` first") from None
    p = _plan(sql, row_limit)
    parts = {}
    deadline = time.monotonic() + timeout_s
    for name, sql_ in p.scans.items():
        parts[name] = [_scan(engine, name, t, sql_, deadline) for t in tables.get(name, [])]
    table, limited = _finish(p, parts, timeout_s)
    return QueryResult(table, [], limited, row_limit)


def _scan(engine: Any, name: str, t: Any, sql: str, deadline: float) -> Any:
    try:
        return engine.scan_table(name, t, sql, deadline=deadline)
    except engine.QueryError as e:
        raise QueryError(str(e)) from None


def _plan(sql: str, row_limit: int | None) -> Any:
    from monarch_telemetry import engine

    try:
        return engine.plan(sql, row_limit)
    except engine.QueryError as e:
        raise QueryError(str(e), "`monarch query --tables` lists the tables and columns") from None


def _finish(p: Any, parts: dict, timeout_s: float) -> tuple[Any, bool]:
    from monarch_telemetry import engine

    try:
        return engine.finish(p, parts, deadline=time.monotonic() + timeout_s)
    except engine.QueryTimeout as e:
        raise QueryError(str(e), "a longer --timeout, or a narrower query (WHERE, LIMIT)") from None
    except engine.QueryError as e:
        raise QueryError(str(e)) from None


def stacks(record: JobRecord, *, hosts: list[HostRecord] | None = None, ranks: list[int] | None = None,
           pids: list[int] | None = None, dump_id: str | None = None, timeout_s: float = 30.0) -> QueryResult:
    """Live Python stacks (py-spy) of every proc and rank, or of ``ranks`` of the running run on ``hosts``
    (``pids``: only those procs; ``dump_id`` marks the rows the hosts keep, the admin API's stored dumps)."""
    import pyarrow as pa

    from monarch_agents.messages import TakeStacks
    from monarch_telemetry.schema import TABLES
    from monarch_telemetry.table import from_ipc

    answers, errors = _fan_out(record, lambda port: TakeStacks(ranks, port, pids, dump_id), timeout_s, hosts)
    tables = [from_ipc(a) for a in answers.values()]
    table = pa.concat_tables(tables) if tables else TABLES["stacks"].schema.empty_table()
    missing = [h for h in errors]
    return QueryResult(table, missing, False, None, errors)


def save(record: JobRecord, directory: str, *, timeout_s: float = 60.0) -> tuple[list[str], dict[str, str]]:
    """Fetch every row of every host and write ``directory/<table>/<host>.parquet`` here.

    Returns (files written, {host: why it gave nothing}).  Written by this process, so the
    save needs no filesystem shared with the hosts.
    """
    import os

    from monarch_agents.messages import TelemetryScan
    from monarch_telemetry import parquet
    from monarch_telemetry.schema import TABLES
    from monarch_telemetry.table import from_ipc

    directory = os.path.abspath(directory)
    scans = {name: f'SELECT * FROM "{name}"' for name, spec in TABLES.items() if not spec.source}
    answers, errors = _fan_out(record, lambda port: TelemetryScan(scans, timeout_s * _HOST_MARGIN, port), timeout_s)
    files: list[str] = []
    for host, answer in answers.items():
        tables = {t: from_ipc(v) for t, v in answer.items() if not isinstance(v, str)}
        files.extend(parquet.write_host(directory, host, tables))
    files.extend(parquet.write_host(directory, PROGRAM_HOST, program_tables(record, list(_PROGRAM_TABLES))))
    return files, errors


def query_stopped(record: JobRecord, sql: str, *, row_limit: int | None = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> QueryResult:
    """Run ``sql`` over what a stopped reservation left in its job folder: ``run_ranks`` and
    ``logs`` of its commands and actor programs (the agents' other tables went with them)."""
    from monarch_telemetry import engine

    p = _plan(sql, row_limit)
    tables = stopped_tables(record, list(p.scans))
    deadline = time.monotonic() + timeout_s
    parts = {name: [_scan(engine, name, tables[name], sql_, deadline)] if name in tables else []
             for name, sql_ in p.scans.items()}
    table, limited = _finish(p, parts, timeout_s)
    return QueryResult(table, [], limited, row_limit)


def stopped_tables(record: JobRecord, names: list[str]) -> dict[str, "pa.Table"]:
    """``run_ranks`` and ``logs`` rows of every run a stopped reservation kept on disk."""
    import pyarrow as pa

    from monarch._workbench.logs import LogReader, local_fetch
    from monarch._workbench.run import run_history
    from monarch_agents.services.runs import RankExit
    from monarch_telemetry.schema import TABLES

    import os

    wanted = [n for n in names if n in _PROGRAM_TABLES]
    out = program_tables(record, wanted)
    ranks, lines = [], []
    by_rank = {h.host_rank: h.host for h in record.hosts}
    for r in run_history(record):
        if r.get("kind") == "program":
            continue
        for i, hr in enumerate(r.get("hosts") or []):
            run_dir = os.path.join(record.job_dir, "logs", f"host{hr}", "runs", os.path.basename(r["run_id"]))
            if not os.path.isdir(run_dir):
                continue  # on a node whose logs this machine does not see
            try:
                with open(os.path.join(run_dir, f"{i}.exit"), "rb") as f:
                    ex = RankExit.parse(f.read())
            except OSError:
                ex = None
            host = by_rank.get(hr, f"host{hr}")
            started = int(r["started"] * 1e6)
            code = ex.code if ex is not None else None
            ranks.append({"run_id": r["run_id"], "rank": i, "host": host, "argv": shlex.join(map(str, r["argv"])),
                          "cwd": None, "pid": 0, "started": started,
                          "ended": int(ex.ended * 1e6) if ex is not None else None, "exit_code": code,
                          "signal": -code if code is not None and code < 0 else None,
                          "reason": ex.reason if ex is not None else "no exit recorded (stopped while running?)"})
            if "logs" not in wanted:
                continue
            mine: list[tuple[str, bytes]] = []
            partial = {"stdout": b"", "stderr": b""}
            for chunk in LogReader(local_fetch(run_dir), [i]).poll():
                *done, partial[chunk.stream] = (partial[chunk.stream] + chunk.data).split(b"\n")
                mine.extend((chunk.stream, line) for line in done)
            mine.extend((st, rest) for st, rest in partial.items() if rest)
            for j, (stream, line) in enumerate(mine[-_PROGRAM_LOG_LINES:]):
                lines.append({"time": started + j, "host": host, "run_id": r["run_id"], "rank": i, "proc": None,
                              "stream": stream, "line": line.decode(errors="replace")})
    extra = {"run_ranks": ranks, "logs": lines}
    for n in wanted:
        more = pa.Table.from_pylist(extra[n], schema=TABLES[n].schema)
        out[n] = pa.concat_tables([out[n], more]) if n in out else more
    for n in names:
        if n in TABLES and n not in out:
            out[n] = TABLES[n].schema.empty_table()
    return out


#: The ``host`` of an actor program's rows: it runs on the machine `monarch run` was typed on.
PROGRAM_HOST = "client"
_PROGRAM_TABLES = ("run_ranks", "logs")
#: The newest lines of a program that ``logs`` rows are made of (`monarch logs` has them all).
_PROGRAM_LOG_LINES = 5000


def program_tables(record: JobRecord, names: list[str]) -> dict[str, "pa.Table"]:
    """``run_ranks`` and ``logs`` rows of the reservation's actor programs, from its job folder
    (:func:`program_rows`), as tables."""
    if not names:
        return {}
    import pyarrow as pa

    from monarch_telemetry.schema import TABLES

    tables = program_rows(record, names)
    return {n: pa.Table.from_pylist(tables[n], schema=TABLES[n].schema) for n in names if n in tables}


def program_rows(record: JobRecord, names: list[str]) -> dict[str, list[dict]]:
    """``run_ranks`` and ``logs`` rows of the reservation's actor programs, from its job folder.

    A program is one rank (0) on host ``client``; its lines get the run's start time plus their
    index in microseconds (the folder keeps their order, not when each was written).
    """
    from monarch._workbench.logs import LogReader, local_fetch, program_run_dir
    from monarch._workbench.run import run_history

    programs = [r for r in run_history(record) if r.get("kind") == "program"]
    ranks, lines = [], []
    for r in programs:
        started = int(r["started"] * 1e6)
        ended = int(r["ended"] * 1e6) if r.get("ended") is not None else None
        code = r.get("exit_code")
        ranks.append({"run_id": r["run_id"], "rank": 0, "host": PROGRAM_HOST, "argv": shlex.join(map(str, r["argv"])),
                      "cwd": None, "pid": 0, "started": started, "ended": ended, "exit_code": code, "signal": None,
                      "reason": None})
        if "logs" not in names:
            continue
        mine: list[tuple[str, bytes]] = []
        partial = {"stdout": b"", "stderr": b""}
        for chunk in LogReader(local_fetch(program_run_dir(record, r["run_id"])), [0]).poll():
            *done, partial[chunk.stream] = (partial[chunk.stream] + chunk.data).split(b"\n")
            mine.extend((chunk.stream, line) for line in done)
        mine.extend((s, rest) for s, rest in partial.items() if rest)
        for i, (stream, line) in enumerate(mine[-_PROGRAM_LOG_LINES:]):
            lines.append({"time": started + i, "host": PROGRAM_HOST, "run_id": r["run_id"], "rank": 0, "proc": None,
                          "stream": stream, "line": line.decode(errors="replace")})
    tables = {"run_ranks": ranks, "logs": lines}
    return {n: tables[n] for n in names if n in tables}


@dataclass
class Rows:
    """A query's answer as plain rows: what :func:`query_on_agent` gives (no pyarrow here), read
    the way the CLI reads an Arrow table (``column_names``, ``num_rows``, ``to_pylist``)."""

    column_names: list[str]
    rows: list[list]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def to_pylist(self) -> list[dict]:
        return [dict(zip(self.column_names, r)) for r in self.rows]


def _program_tables_named(sql: str) -> list[str]:
    """The tables of actor programs (:data:`_PROGRAM_TABLES`) that ``sql`` may read: named in it,
    or through a view that names them.  Only these are read from the job folder and sent along
    (every run ever made is in the runs file): a query of other tables reads none."""
    import re

    from monarch_telemetry.schema import VIEWS

    words = set(re.findall(r"[a-z_][a-z0-9_]*", sql.lower()))
    named = set(words)
    for v in VIEWS.values():
        if v.name in words:
            named.update(re.findall(r"[a-z_][a-z0-9_]*", v.sql.lower()))
    return [t for t in _PROGRAM_TABLES if t in named]


#: Past this many rows an answer is finished here (on the client's engine), not carried as plain rows.
_AGENT_ROWS_MAX = 100_000


def query_on_agent(record: JobRecord, sql: str, *, row_limit: int | None = None,
                   timeout_s: float = DEFAULT_TIMEOUT_S, strict: bool = False) -> QueryResult:
    """:func:`query`, answered by the reservation's first host agent: it plans, asks every host
    through the tree of host agents and finishes on its engine (warm between queries); this
    process imports neither pyarrow nor DataFusion.  Its ``table`` is :class:`Rows`.

    Asked here instead (:func:`query`): pods (their agents hold no client key to ask others with),
    every message straight from the client (``MONARCH_FANOUT_DEGREE=0``), an answer of unbounded
    rows, or a first host that fails.  Even at 2 hosts this is the quicker: the client's own engine
    costs ~0.3 CPU-s of imports per command (2.5 s at load 12), the agent's is imported once."""
    from monarch_agents import fanout
    from monarch_agents.messages import TelemetryQuery

    hosts = sorted(record.hosts, key=lambda h: h.host_rank)
    if (record.spec.scheduler == "kubernetes" or row_limit is None or row_limit > _AGENT_ROWS_MAX
            or fanout.DEGREE <= 0 or not hosts):
        return query(record, sql, row_limit=row_limit, timeout_s=timeout_s, strict=strict)
    wanted = _program_tables_named(sql)
    extra = {n: rows for n, rows in program_rows(record, wanted).items() if rows} if wanted else {}
    targets = [[h.addr, h.host] for h in hosts]
    try:
        answer = record.runtime().request(
            hosts[0].addr, lambda port: TelemetryQuery(sql, row_limit, timeout_s, targets, extra, port)
        ).get(timeout=timeout_s + _AGENT_GRACE_S)
    except Exception:  # the first host is gone, hung or older: every host from here, as always
        return query(record, sql, row_limit=row_limit, timeout_s=timeout_s, strict=strict)
    if not isinstance(answer, dict) or "error" not in answer and "rows" not in answer:
        return query(record, sql, row_limit=row_limit, timeout_s=timeout_s, strict=strict)
    if "error" in answer:
        hint = {"plan": "`monarch query --tables` lists the tables and columns",
                "timeout": "a longer --timeout, or a narrower query (WHERE, LIMIT)"}.get(answer.get("kind"), "")
        raise QueryError(str(answer["error"]), hint)
    errors = {str(k): str(v) for k, v in dict(answer.get("errors") or {}).items()}
    missing = [str(h) for h in answer.get("missing") or []]
    if missing and strict:
        raise AgentError(f"{len(missing)} host(s) did not answer: " + "; ".join(f"{h}: {errors.get(h, '')}" for h in missing),
                         "`monarch status` checks every agent; without --strict the answer covers the others")
    return QueryResult(Rows(list(answer["columns"]), list(answer["rows"])), missing, bool(answer.get("limited")),  # type: ignore[arg-type]
                       row_limit, {h: errors.get(h, "") for h in missing})


#: How long past the query's own timeout its first host is waited for.
_AGENT_GRACE_S = 5.0
