"""The host agent's telemetry service: its tables, pushes from procs, scans for ``monarch query``.

It makes the agent's :class:`~monarch_telemetry.host.HostTelemetry` (``agent.telemetry``),
which the runs and procs services tell what happens (ranks started, printed, ended;
procs started, ended).  Procs and clients on this host push their recorded rows
(``TelemetryRows``); ``monarch query`` sends pushed-down scans (``TelemetryScan``);
``monarch stack`` asks for py-spy stacks (``TakeStacks``), the mesh admin API for a
profile (``ProfileProc``).  Every handler only hands the
work to a thread of its own: a slow or huge query never holds the agent's IO thread, and
a scan is cancelled at its deadline.  Listed first among the services, it stops last, so
rows recorded while the others stop are still answered for.  With
``MONARCH_TELEMETRY_SAVE=DIR`` in the agent's environment, its tables are written as
Parquet there when it stops.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents.services import SerialWorker, Service
from monarch_telemetry.host import HostTelemetry

log = logging.getLogger("monarch.telemetry")

SAVE_ENV = "MONARCH_TELEMETRY_SAVE"


class TelemetryService(Service):
    """This host's telemetry tables and the questions asked of them."""

    name = "telemetry"
    blocking = False  # each handler hands its work to a thread of its own at once
    #: Procs of this host push their actors' rows here; queries and stack dumps stay the client's.
    from_local_procs = frozenset({m.TelemetryRows})

    def __init__(self, agent: Any):
        super().__init__(agent)
        self.tel = HostTelemetry(agent.host, agent.host_rank)
        # The debug_sessions table is the debug service's: asked for by type when a query reads it.
        self.tel.debug_rows = self._debug_rows
        self._rows = SerialWorker("telemetry-rows")
        self._stacks = ThreadPoolExecutor(1, thread_name_prefix="telemetry-stacks")
        if WARM_FIRST_ENGINE and agent.host_rank == 0:
            threading.Thread(target=_warm_engine, name="telemetry-warm", daemon=True).start()
        threading.Thread(target=self._warm_scan, name="telemetry-warm-scan", daemon=True).start()

    def _warm_scan(self) -> None:
        """One scan of this host's own rows, soon after start, through the path a query takes (its
        threads started, its code run once in this process): a reservation's first query cost each
        of its agents ~4 ms more than the next (64 hosts: 0.31 CPU-s, then 0.05-0.08).  Spread over
        a few seconds by host rank, so 256 agents do not all do it at once."""
        stopping = getattr(self.agent, "stopping", None) or threading.Event()
        if stopping.wait(_WARM_SCAN_AFTER_S + (int(self.agent.host_rank) % 64) * _WARM_SCAN_SPREAD_S):
            return
        try:
            self.tel.scan({"run_ranks": 'SELECT * FROM "run_ranks"'}, 5.0)
        except Exception as e:  # stopping meanwhile: only the first query's speed depends on it
            log.debug("warm scan: %s", e)

    def _debug_rows(self) -> list[dict]:
        from monarch_agents.services.debug import DebugService

        debug = self.agent.service(DebugService)
        return debug.telemetry_rows() if debug is not None else []

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {m.TelemetryRows: self.on_rows, m.TelemetryScan: self.on_scan, m.TakeStacks: self.on_stacks,
                m.ProfileProc: self.on_profile, m.TelemetryQuery: self.on_query, m.TelemetryRetain: self.on_retain}

    def info(self) -> dict:
        store = self.tel._store
        return {"rows": store.num_rows if store else 0, "bytes": store.nbytes if store else 0}

    def stop(self, deadline: float) -> None:
        self._rows.close(deadline)
        directory = os.environ.get(SAVE_ENV, "").strip()
        if directory:
            try:
                self.tel.save(directory)
            except Exception as e:
                log.error("could not save telemetry to %s: %s", directory, e)
        self.tel.close()
        self._stacks.shutdown(wait=False, cancel_futures=True)

    # -- messages ------------------------------------------------------------

    def on_rows(self, msg: m.TelemetryRows) -> None:
        if isinstance(msg.rows, dict):
            self._rows.submit(self.tel.absorb, msg.rows)

    def on_retain(self, msg: m.TelemetryRetain) -> None:
        # After the rows pushed before it (the same worker), so none of them escapes the bound.
        self._rows.submit(self.tel.retain, float(msg.max_age_s))

    def on_scan(self, msg: m.TelemetryScan) -> None:
        self.tel.addr = self.agent.rt.addr
        timeout = min(max(float(msg.timeout_s), 0.01), 600.0)
        reply = msg.reply

        def then(done: Future) -> None:
            self._answer(reply, done.result)

        # Answered from the scan pool's thread when it is done: no thread started (and waited for, by
        # this IO thread, until it runs) per scan, which every host of a query paid on its way.
        self.tel.scan_then(dict(msg.scans), timeout, then)

    def on_query(self, msg: m.TelemetryQuery) -> None:
        threading.Thread(target=self._answer, args=(msg.reply, lambda: self._query(msg)),
                         name="telemetry-query", daemon=True).start()

    def _query(self, msg: m.TelemetryQuery) -> dict:
        """A whole ``monarch query`` here, for an asker that then needs neither pyarrow nor DataFusion
        (~0.4 CPU-s of imports per command): plan, each host's scans through the tree of host agents,
        and the finishing query on this agent's engine, which stays imported between queries."""
        import pyarrow as pa

        from monarch_agents.fanout import fan_out
        from monarch_telemetry import engine
        from monarch_telemetry.schema import TABLES
        from monarch_telemetry.table import from_ipc

        timeout = min(max(float(msg.timeout_s), 0.05), 600.0)
        try:
            p = engine.plan(str(msg.sql), None if msg.row_limit is None else int(msg.row_limit))
        except engine.QueryError as e:
            return {"error": str(e), "kind": "plan"}
        parts: dict[str, list] = {t: [] for t in p.scans}
        hosts = [(str(a), str(h)) for a, h in msg.hosts]
        errors: dict[str, str] = {}
        if p.needs_hosts and hosts:
            # As the asker would: hosts stop scanning before it stops waiting, so a slow one says so.
            wait = timeout * _ASK_SHARE
            call = fan_out(self.agent.rt, [(a, h, m.TelemetryScan(p.scans, max(0.05, wait * _ASK_SHARE), _NO_PORT))
                                           for a, h in hosts], timeout_s=wait)
            call.wait(wait + 0.5)
            for i, (_, host) in enumerate(hosts):
                ok, value = call.results.get(i, (False, f"no answer within {timeout:g} s"))
                if not ok or not isinstance(value, dict):
                    errors[host] = (str(value).splitlines() or ["no answer"])[0]
                    continue
                bad = [v for v in value.values() if isinstance(v, str)]
                if bad:
                    errors[host] = bad[0]
                    continue
                for table, data in value.items():
                    if table in parts:
                        parts[table].append(from_ipc(data))
        deadline = time.monotonic() + timeout
        try:
            for name, rows in dict(msg.extra or {}).items():
                if name in parts and rows:
                    extra = pa.Table.from_pylist(list(rows), schema=TABLES[name].schema)
                    parts[name].append(engine.scan_table(name, extra, p.scans[name], deadline=deadline))
            table, limited = engine.finish(p, parts, deadline=deadline)
        except engine.QueryError as e:
            return {"error": str(e), "kind": "timeout" if isinstance(e, engine.QueryTimeout) else "finish"}
        columns = [c.to_pylist() for c in table.columns]
        return {"columns": list(table.column_names), "rows": [[_plain(v) for v in r] for r in zip(*columns)],
                "limited": bool(limited), "missing": [h for _, h in hosts if h in errors], "errors": errors}

    def on_stacks(self, msg: m.TakeStacks) -> None:
        ranks = [int(r) for r in msg.ranks] if msg.ranks else None
        pids = [int(p) for p in msg.pids] if msg.pids is not None else None
        dump_id = str(msg.dump_id) if msg.dump_id else None
        self._stacks.submit(self._answer, msg.reply, lambda: self.tel.take_stacks(ranks, pids=pids, dump_id=dump_id))

    def on_profile(self, msg: m.ProfileProc) -> None:
        # A thread of its own: a profile lasts its whole duration and must not hold stack dumps up.
        threading.Thread(target=self._answer, args=(msg.reply, lambda: self._profile(msg)),
                         name="telemetry-profile", daemon=True).start()

    def _profile(self, msg: m.ProfileProc) -> dict:
        from monarch_telemetry.stacks import profile_svg

        pid = int(msg.pid)
        if not self.tel.live_proc(pid):  # only procs this agent runs: never any process of the host
            return {"error": "not_found", "message": f"no live proc {pid} on host {self.agent.host!r}"}
        p = profile_svg(pid, int(msg.duration_s), int(msg.rate_hz), native=bool(msg.native),
                        threads=bool(msg.threads), nonblocking=bool(msg.nonblocking))
        return {"svg": p.svg} if p.svg is not None else {"error": p.error, "message": p.message}

    def _answer(self, reply: m.PortRef, work: Callable[[], Any]) -> None:
        try:
            value = work()
        except (Exception, CancelledError) as e:  # cancelled: the scan pool was shut down (the agent stops)
            log.warning("telemetry request failed: %s", e)
            self.agent.reply(reply, RuntimeError(f"telemetry on {self.agent.host}: {e}"), ok=False)
            return
        self.agent.reply(reply, value)


#: Set by the local launcher (``host_agent.fork_hosts``) where ``monarch query`` goes to the first
#: host agent (enough hosts for the tree): that agent plans and finishes one query soon after it
#: starts, so a reservation's first query does not pay for the engine's first session (~0.1 CPU-s).
WARM_FIRST_ENGINE = False
#: Every agent runs one scan of its own this long after it starts, plus its rank's share of a spread.
_WARM_SCAN_AFTER_S = 2.0
_WARM_SCAN_SPREAD_S = 0.05
#: How long after its start the first host agent warms its engine (serve has answered by then).
_WARM_AFTER_S = 2.0
_WARM_SQL = "SELECT host, count(*) AS n, min(exit_code) AS lo FROM run_ranks WHERE rank >= 0 GROUP BY host"


def _warm_engine() -> None:
    time.sleep(_WARM_AFTER_S)
    try:
        from monarch_telemetry import engine

        p = engine.plan(_WARM_SQL, 1000)
        engine.finish(p, {t: [] for t in p.scans}, deadline=time.monotonic() + 60.0)
    except Exception as e:  # only the first query's speed depends on it
        log.debug("could not warm the query engine: %s", e)


#: The answer port of a message sent through the tree (the tree gives it its own).
_NO_PORT = m.PortRef("", 0)
#: Of a query's time, what the hosts' scans get (and of that, what each host's own scan gets).
_ASK_SHARE = 0.8


def _plain(v: Any) -> Any:
    """A value of an answer row as the wire carries it: builtins only (a timestamp as its text,
    which is how every output format of ``monarch query`` prints one)."""
    if v is None or isinstance(v, (str, int, float, bool, bytes)):
        return v
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)
