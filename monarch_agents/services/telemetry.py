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
from concurrent.futures import ThreadPoolExecutor
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

    def _debug_rows(self) -> list[dict]:
        from monarch_agents.services.debug import DebugService

        debug = self.agent.service(DebugService)
        return debug.telemetry_rows() if debug is not None else []

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {m.TelemetryRows: self.on_rows, m.TelemetryScan: self.on_scan, m.TakeStacks: self.on_stacks,
                m.ProfileProc: self.on_profile}

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

    def on_scan(self, msg: m.TelemetryScan) -> None:
        self.tel.addr = self.agent.rt.addr
        timeout = min(max(float(msg.timeout_s), 0.01), 600.0)
        threading.Thread(target=self._answer, args=(msg.reply, lambda: self.tel.scan(dict(msg.scans), timeout)),
                         name="telemetry-scan-wait", daemon=True).start()

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
        except Exception as e:
            log.warning("telemetry request failed: %s", e)
            self.agent.reply(reply, RuntimeError(f"telemetry on {self.agent.host}: {e}"), ok=False)
            return
        self.agent.reply(reply, value)
