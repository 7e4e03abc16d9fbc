"""A host agent's telemetry: its tables, what it records itself, and the scans it answers.

:class:`HostTelemetry` holds the host's :class:`~monarch_telemetry.table.Store`.  The host
agent's services tell it what happens (a rank started, printed, ended; a proc started,
ended); procs and clients push their recorded rows (:meth:`absorb`); ``monarch query``
asks it for scans (:meth:`scan`), which run on a small pool of their own threads, never
on the agent's IO thread, each cancelled at its deadline.  Rows stay until the agent
stops (``monarch stop``), so a finished or failed run can still be asked about;
:meth:`save` writes them as Parquet first when asked to.

What it does not do: talk to the network (the agent's telemetry service does), or plan
queries (the asker does, see ``engine.py``).
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from monarch_telemetry.recorder import Recorder, now_us

#: Scans answered at once; more wait their turn (a query cannot starve the agent of CPU).
_SCAN_WORKERS = 2
#: Runs, ranks and exited procs remembered for the snapshot tables.
_HISTORY = 5000
_PARTIAL_MAX = 65536
#: Lines this agent buffers before they become Arrow (and count against the table's bounds).
_SEAL_ROWS = 8192
#: ... or once their text is this long: 8,192 rows of 64 KiB lines were 512 MiB held outside the bounds.
_SEAL_BYTES = 4 << 20


@dataclass
class _RankRow:
    run_id: str
    rank: int
    argv: str
    cwd: str | None
    started: int
    pid: int = 0
    ended: int | None = None
    exit_code: int | None = None
    reason: str | None = None


@dataclass
class _ProcRow:
    pid: int
    kind: str
    mesh: str
    run_id: str | None
    rank: int | None
    started: int
    ended: int | None = None
    exit_code: int | None = None
    reason: str | None = None


class HostTelemetry:
    """Everything one host agent holds and answers about telemetry."""

    def __init__(self, host: str, host_rank: int = 0, *, max_rows: int | None = None, max_bytes: int | None = None):
        self.host = host
        self.host_rank = host_rank
        self.started = now_us()
        self.agent_pid = os.getpid()
        self.addr = ""
        self.lock = threading.Lock()
        self._max_rows, self._max_bytes = max_rows, max_bytes
        self._store = None  # made on first use: importing pyarrow costs ~0.2 s of the agent's start
        self.recorder = Recorder(host)
        self.ranks: OrderedDict[tuple[str, int], _RankRow] = OrderedDict()
        self.procs: OrderedDict[int, _ProcRow] = OrderedDict()
        self._partial: dict[tuple[str, int, str], bytes] = {}
        self._unsealed_bytes = 0  # text of the log lines buffered since the last flush
        self._pool = ThreadPoolExecutor(_SCAN_WORKERS, thread_name_prefix="telemetry-scan")
        #: The ``debug_sessions`` rows now (set by the host agent's debug service).
        self.debug_rows: Callable[[], list[dict]] = lambda: []

    @property
    def store(self):
        if self._store is None:
            with self.lock:
                if self._store is None:
                    from monarch_telemetry.table import Store

                    store = Store(max_rows=self._max_rows, max_bytes=self._max_bytes)
                    store.provide("hosts", self._hosts_rows)
                    store.provide("procs", self._procs_rows)
                    store.provide("run_ranks", self._rank_rows)
                    store.provide("debug_sessions", lambda: self.debug_rows())
                    self._store = store
        return self._store

    # -- what the agent's services tell it --------------------------------------------------

    def rank_started(self, run_id: str, rank: int, argv: list, cwd: str | None) -> None:
        with self.lock:
            self.ranks[(run_id, rank)] = _RankRow(run_id, rank, shlex.join(str(a) for a in argv), cwd, now_us())
            _trim(self.ranks)

    def rank_pid(self, run_id: str, rank: int, pid: int) -> None:
        with self.lock:
            row = self.ranks.get((run_id, rank))
            if row is not None:
                row.pid = pid
            self.procs[pid] = _ProcRow(pid, "rank", "", run_id, rank, row.started if row else now_us())
            _trim(self.procs)

    def rank_output(self, run_id: str, rank: int, stream: str, data: bytes) -> None:
        """Bytes a rank wrote; each complete line becomes a ``logs`` row."""
        if not self.recorder.on:
            return
        key = (run_id, rank, stream)
        buf = self._partial.pop(key, b"") + data
        *lines, rest = buf.split(b"\n")
        if len(rest) > _PARTIAL_MAX:
            lines.append(rest)
            rest = b""
        if rest:
            self._partial[key] = rest
        log = self.recorder.log_line
        for line in lines:
            log(stream, line.decode(errors="replace").rstrip("\r"), run_id=run_id, rank=rank)
            self._unsealed_bytes += len(line)
        if self.recorder.buffers["logs"].rows >= _SEAL_ROWS or self._unsealed_bytes >= _SEAL_BYTES:
            self._unsealed_bytes = 0
            # Into the store, whose row and byte bounds hold (the buffer's list of lines has none).
            self.flush()

    def rank_ended(self, run_id: str, rank: int, code: int, reason: str) -> None:
        for stream in ("stdout", "stderr"):
            rest = self._partial.pop((run_id, rank, stream), b"")
            if rest:
                self.recorder.log_line(stream, rest.decode(errors="replace"), run_id=run_id, rank=rank)
        with self.lock:
            row = self.ranks.get((run_id, rank))
            if row is not None:
                row.ended, row.exit_code, row.reason = now_us(), code, reason
                proc = self.procs.get(row.pid)
                if proc is not None and proc.ended is None:
                    proc.ended, proc.exit_code, proc.reason = row.ended, code, reason

    def proc_started(self, pid: int, mesh: str) -> None:
        with self.lock:
            self.procs[pid] = _ProcRow(pid, "proc", mesh, None, None, now_us())
            _trim(self.procs)

    def proc_ended(self, pid: int, code: int | None, reason: str) -> None:
        with self.lock:
            row = self.procs.get(pid)
            if row is not None and row.ended is None:
                row.ended, row.exit_code, row.reason = now_us(), code, reason

    def absorb(self, taken: dict) -> None:
        """Rows a proc or client on this host recorded (see ``Recorder.take``)."""
        self.store.absorb(taken)

    # -- answering ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Move what this agent recorded itself into its tables."""
        taken = self.recorder.take()
        if taken:
            self.store.absorb(taken)

    def retain(self, max_age_s: float) -> None:
        """Keep the rows of :data:`~monarch_telemetry.table.RETAINED` tables only ``max_age_s`` seconds
        (0: no age bound), as Monarch's ``retention_secs``."""
        self.store.retain(max_age_s)

    def batches(self, table: str) -> list:
        return self.store.batches(table)

    def scan(self, scans: dict[str, str], timeout_s: float) -> dict[str, Any]:
        """Run each pushed-down scan over this host's rows: {table: Arrow IPC bytes, or an error string}.

        Blocks the calling thread; runs on the scan pool, cancelled ``timeout_s`` from now.
        """
        deadline = time.monotonic() + timeout_s
        return self._pool.submit(self._scan, scans, deadline).result()

    def scan_then(self, scans: dict[str, str], timeout_s: float, then: Callable[[Future], None]) -> None:
        """:meth:`scan` without a thread waiting for it: ``then(future)`` runs on the scan pool's
        thread when the scan is done (or at once, here, if the pool is shut down)."""
        deadline = time.monotonic() + timeout_s
        try:
            future = self._pool.submit(self._scan, scans, deadline)
        except RuntimeError as e:  # shut down: the agent stops
            future = Future()
            future.set_exception(e)
        future.add_done_callback(then)

    def _scan(self, scans: dict[str, str], deadline: float) -> dict[str, Any]:
        from monarch_telemetry.raw import RAW_MAX_ROWS, mark_raw
        from monarch_telemetry.table import to_ipc

        self.flush()
        out: dict[str, Any] = {}
        for table, sql in scans.items():
            batches = self.batches(table)
            if sum(b.num_rows for b in batches) <= RAW_MAX_ROWS:
                # A few rows travel as they are and the asker scans them with every other small
                # host's at once: no SQL engine here (its import is ~0.3 CPU-s and ~25 MiB an agent,
                # and each scan ~10 ms, which a machine of 256 simulated hosts pays 256 times).
                schema = mark_raw(batches[0].schema if batches else _schema(table))
                out[table] = to_ipc([b.replace_schema_metadata(schema.metadata) for b in batches], schema)
                continue
            from monarch_telemetry.engine import QueryError, run_scan

            try:
                result = run_scan(self.batches, table, sql, deadline=deadline)
                out[table] = to_ipc(result.to_batches(), result.schema)
            except QueryError as e:
                out[table] = str(e)
        return out

    def take_stacks(self, ranks: list[int] | None = None, procs: bool = True, pids: list[int] | None = None,
                    dump_id: str | None = None) -> bytes:
        """Stacks of live procs and ranks here (``ranks``: only those run ranks, no procs; ``pids``:
        only those procs, no ranks), as ``stacks`` rows.

        The rows are kept in the ``stacks`` table too, marked with ``dump_id`` when given; the
        answer is them as Arrow IPC bytes.
        """
        import pyarrow as pa

        from monarch_telemetry.schema import TABLES
        from monarch_telemetry.stacks import Target, take
        from monarch_telemetry.table import to_ipc

        with self.lock:
            live = [p for p in self.procs.values() if p.ended is None]
        targets = [Target(p.pid, p.kind, p.run_id, p.rank) for p in live
                   if (p.kind == "rank" and (ranks is None or p.rank in ranks))
                   or (p.kind == "proc" and procs and ranks is None)]
        if pids is not None:
            targets = [t for t in targets if t.kind == "proc" and t.pid in pids]
        rows = take(targets, self.host, now_us())
        if dump_id is not None:
            for row in rows:
                row["dump_id"] = dump_id
        schema = TABLES["stacks"].schema
        batch = pa.RecordBatch.from_pylist(rows, schema=schema)
        if rows:
            self.store["stacks"].append_batch(batch)
        return to_ipc([batch], schema)

    def live_proc(self, pid: int) -> bool:
        """Whether ``pid`` is a proc (not a rank) this host started and that still runs."""
        with self.lock:
            p = self.procs.get(pid)
        return p is not None and p.kind == "proc" and p.ended is None

    def save(self, directory: str) -> list[str]:
        """Write every table this host holds as Parquet under ``directory`` (see ``parquet.py``)."""
        from monarch_telemetry.parquet import save_host

        self.flush()
        return save_host(self.store, directory, self.host)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- snapshot tables ---------------------------------------------------------------------

    def _hosts_rows(self) -> list[dict]:
        import psutil

        vm = psutil.virtual_memory()
        try:
            rss = psutil.Process().memory_info().rss
        except psutil.Error:
            rss = None
        with self.lock:
            procs_alive = sum(1 for p in self.procs.values() if p.kind == "proc" and p.ended is None)
            ranks_alive = sum(1 for p in self.procs.values() if p.kind == "rank" and p.ended is None)
        store = self._store
        return [{
            "host": self.host, "host_rank": self.host_rank, "agent_pid": self.agent_pid, "addr": self.addr,
            "started": self.started, "uptime_s": (now_us() - self.started) / 1e6, "cpu_count": os.cpu_count() or 0,
            "load_1m": os.getloadavg()[0], "memory_total_bytes": vm.total, "memory_available_bytes": vm.available,
            "agent_rss_bytes": rss, "procs_alive": procs_alive, "ranks_alive": ranks_alive,
            "telemetry_rows": store.num_rows if store else 0, "telemetry_bytes": store.nbytes if store else 0,
        }]

    def _procs_rows(self) -> list[dict]:
        import psutil

        with self.lock:
            procs = list(self.procs.values())
        rows = []
        for p in procs:
            rss = None
            if p.ended is None:
                try:
                    rss = psutil.Process(p.pid).memory_info().rss
                except psutil.Error:
                    pass
            code = p.exit_code
            rows.append({
                "host": self.host, "pid": p.pid, "kind": p.kind, "mesh": p.mesh, "run_id": p.run_id, "rank": p.rank,
                "status": _status(p.ended, code), "exit_code": code, "signal": -code if code is not None and code < 0 else None,
                "reason": p.reason, "rss_bytes": rss, "started": p.started, "ended": p.ended,
            })
        return rows

    def _rank_rows(self) -> list[dict]:
        with self.lock:
            ranks = list(self.ranks.values())
        return [{
            "run_id": r.run_id, "rank": r.rank, "host": self.host, "argv": r.argv, "cwd": r.cwd, "pid": r.pid,
            "started": r.started, "ended": r.ended, "exit_code": r.exit_code,
            "signal": -r.exit_code if r.exit_code is not None and r.exit_code < 0 else None, "reason": r.reason,
        } for r in ranks]


def warm() -> None:
    """Answer one scan of every table here, on this thread, over a throwaway host's rows.

    The local scheduler's launcher calls it before it forks the host agents: what a first scan
    sets up (pyarrow's IPC writer and type caches, psutil, this module's code) is then in pages
    every agent shares, instead of each agent paying for it in the first ``monarch query``.
    No thread is started (the scan pool is bypassed): threads do not survive a fork.
    """
    from monarch_telemetry.schema import TABLES

    t = HostTelemetry("warm")
    t.rank_started("warm", 0, ["true"], None)
    t.rank_pid("warm", 0, os.getpid())
    t.rank_ended("warm", 0, 0, "exited")
    t._scan({name: f'SELECT * FROM "{name}"' for name in TABLES}, time.monotonic() + 30.0)
    t.close()


def _schema(table: str):
    from monarch_telemetry.schema import TABLES

    return TABLES[table].schema


def _status(ended: int | None, code: int | None) -> str:
    if ended is None:
        return "running"
    if code is None or code > 0:
        return "failed"
    return "killed" if code < 0 else "exited"


def _trim(d: OrderedDict) -> None:
    while len(d) > _HISTORY:
        d.popitem(last=False)
