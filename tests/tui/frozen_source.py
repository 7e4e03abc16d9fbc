"""A frozen reservation for the dashboard: real telemetry saved once, read back through the real SQL.

:class:`FrozenReservationSource` is a :class:`ReservationSource` whose reservation does not
move: its tables are what a real 2-host reservation saved with ``monarch stop --save``
(recorded by ``tests/tui/record_frozen_reservation.py``), queried with
the engine of ``monarch query --from DIR`` (``monarch_telemetry.engine.query_tables``), so the
dashboard's own SQL (``ReservationSource._poll_tables``, ``logs``, the SQL console) runs
unchanged.  Only what is no table comes from ``reservation.json``: the header's facts, the
debug sessions, and the moment the snapshot was taken.  Pids, times, addresses and uptimes
are the recording's, so a screenshot of the app is the same on every run.

It is the input of the snapshot tests and of the 1,000-proc tests (whose tables are the
recording's, scaled up by :func:`scale_procs`), not a stand-in for a reservation: every
test of the data itself runs against a real one (tests/tui/test_dashboard.py).
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

from monarch_cli.tui.source import ReservationSource, Snapshot

#: The recording the snapshot tests draw.
FROZEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "frozen")


class FrozenReservationSource(ReservationSource):
    """The saved reservation in ``directory`` (``reservation.json`` + ``telemetry/``), read as if live."""

    def __init__(self, directory: str = FROZEN_DIR):
        super().__init__(path=os.path.join(directory, "reservation.json"))
        self.directory = directory
        with open(self.path) as f:
            self.meta = json.load(f)
        hosts = [SimpleNamespace(**h) for h in self.meta["hosts"]]
        self._record = SimpleNamespace(name=self.meta["name"], job_id=self.meta["job_id"], hosts=hosts,
                                       spec=SimpleNamespace(scheduler=self.meta["scheduler"]))
        self._description = SimpleNamespace(time_left_s=self.meta["time_left_s"])
        self._tables: dict | None = None
        #: What stop_run / kill_proc were asked to do.
        self.actions: list[tuple] = []

    def record(self) -> Any:
        return self._record

    def query(self, sql: str, *, timeout_s: float = 10.0, row_limit: int | None = None) -> Any:
        """``sql`` over the saved tables, as ``monarch query --from DIR`` runs it (tables read once)."""
        from monarch.errors import QueryError
        from monarch._workbench.telemetry import QueryResult
        from monarch_telemetry import engine, parquet

        if self._tables is None:
            self._tables = parquet.load(os.path.join(self.directory, "telemetry"))
        try:
            table, limited = engine.query_tables(sql, self._tables, row_limit=row_limit,
                                                 deadline=time.monotonic() + timeout_s)
        except engine.QueryError as e:
            raise QueryError(str(e), "`monarch query --tables` lists the tables and columns") from None
        return QueryResult(table, [], limited, row_limit)

    def poll(self) -> Snapshot:
        snap = super().poll()
        snap.taken_at = self.meta["taken_at"]
        return snap

    def _poll_debug(self, record: Any, snap: Snapshot) -> None:
        from monarch._workbench.debug import DebugSessionInfo

        snap.debug = [DebugSessionInfo(**s) for s in self.meta["debug"]]
        paused = {(s.host, s.pid) for s in snap.debug}
        for p in snap.procs:
            p.in_debugger = (p.host, p.pid) in paused

    def stacks(self) -> Any:
        """The `monarch stack` dump taken while recording (the newest of each process)."""
        return self.query("SELECT host, pid, kind, run_id, rank, thread_id, thread_name, depth, function, "
                          "filename, line, error FROM stacks ORDER BY host, pid, thread_id, depth")

    def stop_run(self, run_id: str) -> None:
        self.actions.append(("stop_run", run_id))

    def kill_proc(self, host: str, pid: int) -> bool:
        self.actions.append(("kill_proc", host, pid))
        return True


def scale_procs(src: str, dst: str, hosts: int, procs: int, actors_per_proc: int = 1) -> None:
    """Write a saved reservation of ``hosts`` hosts and ``procs`` proc agents (spread evenly) to ``dst``.

    Every row is a copy of one the recording holds (a proc of its actor mesh, the actor on
    it and that actor's status events), with a new host, pid and actor id, so the tables
    have the recording's schema and values; the runs, logs and stacks are the recording's.
    """
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from monarch_telemetry import parquet

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("telemetry"))
    tables = parquet.load(os.path.join(src, "telemetry"))

    def rows(name: str) -> list[dict]:
        return [r for t in tables.get(name, []) for r in t.to_pylist()]

    host_row = rows("hosts")[0]
    proc_row = next(r for r in rows("procs") if r["kind"] == "proc")
    actor_row = rows("actors_ext")[0]
    status_rows = [r for r in rows("actor_status_events_ext") if r["actor_id"] == actor_row["id"]]
    names = [f"host{i}" for i in range(hosts)]
    out: dict[str, dict[str, list[dict]]] = {n: {"hosts": [], "procs": [], "actors_ext": [],
                                                 "actor_status_events_ext": []} for n in names}
    for i, n in enumerate(names):
        out[n]["hosts"].append({**host_row, "host": n, "host_rank": i, "procs_alive": procs // hosts})
    for k in range(procs):
        n = names[k % hosts]
        pid = 100000 + k
        out[n]["procs"].append({**proc_row, "host": n, "pid": pid, "rss_bytes": proc_row["rss_bytes"] + 4096 * k})
        for j in range(actors_per_proc):
            aid = 10**12 + k * 1000 + j
            out[n]["actors_ext"].append({**actor_row, "host": n, "pid": pid, "id": aid, "rank": k * actors_per_proc + j,
                                     "display_name": f"trainers[{k * actors_per_proc + j}]",
                                     "full_name": f"{actor_row['full_name']}.{k}.{j}",
                                     "ref_name": f"{actor_row['ref_name']}.{k}.{j}"})
            out[n]["actor_status_events_ext"] += [{**r, "host": n, "actor_id": aid} for r in status_rows]
    telemetry = os.path.join(dst, "telemetry")
    # Tables not scaled (runs, logs, stacks, ...) are the recording's, as saved.
    shutil.copytree(os.path.join(src, "telemetry"), telemetry,
                    ignore=shutil.ignore_patterns("hosts", "procs", "actors", "actor_status_events", "actors_ext",
                                                  "actor_status_events_ext"))
    from monarch_telemetry.schema import TABLES

    for name in ("hosts", "procs", "actors_ext", "actor_status_events_ext"):
        os.makedirs(os.path.join(telemetry, name), exist_ok=True)
        for n in names:
            r = out[n][name]
            if name == "procs":
                # The recording's ranks stay on the hosts they ran on.
                r = r + [x for x in rows("procs") if x["kind"] == "rank" and x["host"] == n]
            pq.write_table(pa.Table.from_pylist(r, schema=TABLES[name].schema),
                           os.path.join(telemetry, name, f"{n}.parquet"))
    meta_path = os.path.join(dst, "reservation.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["hosts"] = [{"host": n, "host_rank": i, "addr": f"tcp://127.0.0.1:{40000 + i}"} for i, n in enumerate(names)]
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)

