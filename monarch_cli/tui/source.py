"""What the dashboard shows, read from a reservation through its public interfaces.

Everything comes from the telemetry SQL of ``monarch query`` (hosts, procs, actors, runs,
logs) and the debug session list of ``monarch debug list``; nothing here talks to an agent
in its own way.  :meth:`ReservationSource.poll` returns one :class:`Snapshot`; a
reservation that is gone gives a snapshot with a ``banner`` instead of raising, and the
next poll recovers when a new reservation replaced it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from monarch.errors import StateError
from monarch_cli.tui.text import MAX_LINE

#: Seconds a query of the dashboard may take before the hosts that did not answer are greyed.
POLL_TIMEOUT_S = 5.0
#: Ask the scheduler whether the allocation lives at most this often (it may run squeue/kubectl).
DESCRIBE_EVERY_S = 5.0
#: Log lines kept for the logs view (the newest).
LOG_LINES = 5000


@dataclass
class HostView:
    """One host agent, as the hosts table and the query fan-out see it."""

    host: str
    host_rank: int
    addr: str
    answering: bool = True
    why_silent: str = ""
    agent_pid: int = 0
    uptime_s: float = 0.0
    cpu_count: int = 0
    load_1m: float = 0.0
    memory_total_bytes: int = 0
    memory_available_bytes: int = 0
    procs_alive: int = 0
    ranks_alive: int = 0


@dataclass
class ProcView:
    """A proc agent or a rank of `monarch run` (a row of the procs table)."""

    host: str
    pid: int
    kind: str
    mesh: str = ""
    run_id: str | None = None
    rank: int | None = None
    status: str = "running"
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    rss_bytes: int | None = None
    argv: str = ""
    in_debugger: bool = False


@dataclass
class ActorView:
    """One actor (a rank of an actor mesh) with its latest lifecycle status."""

    host: str
    pid: int
    name: str
    full_name: str
    rank: int
    status: str = "Created"
    reason: str | None = None
    calls: int = 0
    failed_calls: int = 0


@dataclass
class RunView:
    """One `monarch run` (a row of the runs view) and its ranks (rows of run_ranks)."""

    run_id: str
    argv: str
    hosts: str
    num_ranks: int
    status: str
    failed_ranks: int
    started: Any = None
    ended: Any = None
    ranks: list[dict] = field(default_factory=list)


@dataclass
class Snapshot:
    """The whole reservation at one moment."""

    taken_at: float
    name: str = ""
    scheduler: str = ""
    job_id: str = ""
    time_left_s: float | None = None
    banner: str | None = None
    hosts: list[HostView] = field(default_factory=list)
    procs: list[ProcView] = field(default_factory=list)
    actors: list[ActorView] = field(default_factory=list)
    runs: list[RunView] = field(default_factory=list)
    debug: list[Any] = field(default_factory=list)
    #: The job id of a new live reservation that replaced the one shown (the dashboard starts again on it).
    replaced_by: str | None = None

    @property
    def silent_hosts(self) -> list[str]:
        return [h.host for h in self.hosts if not h.answering]


class ReservationReplaced(StateError):
    """The state file now holds another live reservation (a new job id and keys)."""

    def __init__(self, name: str, job_id: str):
        super().__init__(f"the reservation was replaced by {name!r} ({job_id})", "the dashboard starts again on it")
        self.job_id = job_id


class ReservationSource:
    """Polls one named reservation (or the state file at ``path``) for the dashboard."""

    def __init__(self, name: str | None = None, *, path: str | None = None):
        from monarch._workbench.state import StatePaths

        self.name = name
        self.path = path or StatePaths().resolve(name)
        self._record: Any = None
        self._record_key: tuple | None = None
        self._alive_checked = 0.0
        self._description: Any = None
        self._debug: Any = None
        #: The poll thread refreshes the debug sessions while the pdb pane attaches to one.
        self._debug_lock = threading.Lock()
        self._replaced_seen: tuple[tuple | None, float, StateError | None] = (None, 0.0, None)

    # -- the reservation ----------------------------------------------------------------

    def record(self) -> Any:
        """The live JobRecord, or raise MonarchError saying why there is none."""
        from monarch._workbench.reserve import describe
        from monarch._workbench.state import load_state

        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise StateError(f"no reservation at {self.path}", "`monarch serve` to reserve hosts") from None
        key = (st.st_ino, st.st_mtime_ns)
        if key != self._record_key:
            record = load_state(self.path)
            if self._record is not None and (record.job_id, record.keys) != (self._record.job_id, self._record.keys):
                raise self._replacement(record, key)
            self._record = record
            self._record_key = key
            self._alive_checked = 0.0
            self._debug = None
        now = time.monotonic()
        if now - self._alive_checked >= DESCRIBE_EVERY_S:
            d = describe(self._record)
            if d is None or not d.state.alive:
                why = d.reason if d is not None and d.reason else "the scheduler no longer knows it"
                raise StateError(f"the reservation {self._record.name!r} ({self._record.job_id}) is gone: {why}",
                                 "`monarch serve` to reserve again")
            self._description = d
            self._alive_checked = now
        return self._record

    def _replacement(self, record: Any, key: tuple) -> StateError:
        """What to say of another reservation in the state file: ReservationReplaced once it is live.

        One process talks to one job (its keys), so a live replacement is watched by a new dashboard;
        a `monarch serve` still starting has written a record without all its hosts.
        """
        from monarch._workbench.reserve import describe

        now = time.monotonic()
        seen_key, seen_at, said = self._replaced_seen
        if seen_key == key and said is not None and now - seen_at < DESCRIBE_EVERY_S:
            return said  # the scheduler may be slow to ask (squeue, kubectl): not every poll
        if not record.ready:
            said = StateError(f"the reservation is being replaced by {record.name!r} ({record.job_id})",
                              "waiting for its hosts")
        else:
            d = describe(record)
            if d is not None and d.state.alive:
                said = ReservationReplaced(record.name, record.job_id)
            else:
                said = StateError(f"the reservation was replaced by {record.name!r} ({record.job_id}), which is gone too",
                                  "`monarch serve` to reserve again")
        self._replaced_seen = (key, now, said)
        return said

    # -- polling ------------------------------------------------------------------------

    def query(self, sql: str, *, timeout_s: float = POLL_TIMEOUT_S, row_limit: int | None = None,
              skip_hosts: frozenset[str] = frozenset()) -> Any:
        """Run SQL over every host's telemetry (but ``skip_hosts``), as `monarch query` does."""
        from monarch._workbench.telemetry import query

        record = self.record()
        if skip_hosts:
            record = replace(record, hosts=[h for h in record.hosts if h.host not in skip_hosts])
        return query(record, sql, row_limit=row_limit, timeout_s=timeout_s)

    def poll(self) -> Snapshot:
        """Everything the tree, header, runs and debug views show, in one snapshot."""
        from monarch.errors import MonarchError

        snap = Snapshot(taken_at=time.time(), name=self.name or "")
        try:
            record = self.record()
        except MonarchError as e:
            snap.banner = str(e)
            snap.replaced_by = e.job_id if isinstance(e, ReservationReplaced) else None
            return snap
        except Exception as e:  # a state file of another version, a scheduler command that failed ...
            snap.banner = f"cannot read the reservation: {e}"
            return snap
        snap.name, snap.scheduler, snap.job_id = record.name, record.spec.scheduler, record.job_id
        if self._description is not None:
            snap.time_left_s = self._description.time_left_s
        try:
            self._poll_tables(record, snap)
            self._poll_debug(record, snap)
        except MonarchError as e:
            snap.banner = str(e)
        except Exception as e:  # e.g. the agents' runtime refusing a second job in this process
            snap.banner = f"{type(e).__name__}: {e}"
        return snap

    def _poll_tables(self, record: Any, snap: Snapshot) -> None:
        hosts = self.query("SELECT host, host_rank, agent_pid, uptime_s, cpu_count, load_1m, memory_total_bytes, "
                           "memory_available_bytes, procs_alive, ranks_alive FROM hosts")
        by_host = {r["host"]: r for r in hosts.table.to_pylist()}
        for h in sorted(record.hosts, key=lambda h: h.host_rank):
            row = by_host.get(h.host)
            v = HostView(h.host, h.host_rank, h.addr, answering=row is not None,
                         why_silent=hosts.errors.get(h.host, "" if row else "no answer"))
            if row:
                for k, val in row.items():
                    if val is not None and hasattr(v, k):
                        setattr(v, k, val)
            snap.hosts.append(v)
        # A host that did not answer now is not waited for again in this poll (each query would wait
        # POLL_TIMEOUT_S for it: a refresh of half a minute); the next poll asks it again.
        silent = frozenset(h.host for h in snap.hosts if not h.answering)
        skip = {"skip_hosts": silent} if silent else {}

        runs = self.query("SELECT run_id, argv, hosts, num_ranks, status, failed_ranks, started, ended "
                          "FROM runs ORDER BY started DESC LIMIT 50", **skip)
        snap.runs = [RunView(**r) for r in runs.table.to_pylist()]
        latest = snap.runs[0].run_id if snap.runs else None

        # Proc agents that live or failed, and the ranks of the latest run (older ones: the runs view).
        procs = self.query("SELECT host, pid, kind, mesh, run_id, rank, status, exit_code, signal, reason, rss_bytes "
                           "FROM procs WHERE kind = 'proc' AND status <> 'exited' "
                           + (f"OR kind = 'rank' AND run_id = '{_sql_str(latest)}' " if latest else "")
                           + "ORDER BY host, kind, rank, pid", **skip)
        snap.procs = [ProcView(**r) for r in procs.table.to_pylist()]
        if latest:
            ranks = self.query(f"SELECT run_id, rank, host, argv, pid, exit_code, signal, reason, started, ended "
                               f"FROM run_ranks WHERE run_id = '{_sql_str(latest)}' ORDER BY rank", **skip)
            snap.runs[0].ranks = ranks.table.to_pylist()
            argv = {(r["host"], r["pid"]): r["argv"] for r in snap.runs[0].ranks}
            for p in snap.procs:
                p.argv = argv.get((p.host, p.pid), "")

        live = {(p.host, p.pid) for p in snap.procs if p.kind == "proc"}
        if live:
            actors = self.query(
                "SELECT a.host, a.pid, a.display_name AS name, a.ref_name AS full_name, a.rank, s.status, s.reason, "
                "coalesce(m.calls, 0) AS calls, coalesce(m.failed_calls, 0) AS failed_calls FROM actors_ext a "
                "LEFT JOIN (SELECT actor_id, first_value(new_status ORDER BY timestamp_us DESC) AS status, "
                "first_value(reason ORDER BY timestamp_us DESC) AS reason FROM actor_status_events GROUP BY actor_id) s "
                "ON s.actor_id = a.id "
                "LEFT JOIN (SELECT to_actor_id, count(*) AS calls, sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) "
                "AS failed_calls FROM messages_ext GROUP BY to_actor_id) m ON m.to_actor_id = a.id "
                "WHERE a.ref_name IS NOT NULL "  # (an agent's row: a system actor, not the program's)
                "ORDER BY a.host, a.pid, a.ref_name", row_limit=5000, **skip)
            for r in actors.table.to_pylist():
                if (r["host"], r["pid"]) in live:
                    r["status"] = r["status"] or "Created"
                    snap.actors.append(ActorView(**r))

        for h in snap.hosts:
            if h.host in silent:
                h.why_silent = h.why_silent or "no answer"

    def _poll_debug(self, record: Any, snap: Snapshot) -> None:
        from monarch._workbench.debug import DebugClient

        with self._debug_lock:
            if self._debug is None:
                self._debug = DebugClient(record)
            snap.debug = self._debug.refresh()
        paused = {(s.host, s.pid) for s in snap.debug}
        for p in snap.procs:
            p.in_debugger = (p.host, p.pid) in paused

    def attach_debug(self, session_id: int) -> Any:
        """Hold debug session ``session_id`` (an id the sessions list shows): a ``monarch._workbench.debug.Attachment``.

        Raises ``DebugError`` (one line) when the session has ended or another debugger holds it.
        """
        from monarch._workbench.debug import DebugClient

        record = self.record()
        with self._debug_lock:
            if self._debug is None:
                self._debug = DebugClient(record)
            client = self._debug
            info = client.find(session_id)
        return client.attach(info)

    def shell_command(self, host_rank: int) -> tuple[list[str], dict[str, str]]:
        """The `monarch shell` that opens a shell on ``host_rank`` of this very reservation: (argv, env)."""
        import sys

        return ([sys.executable, "-m", "monarch_cli.main", "shell", "--host", str(int(host_rank))],
                {"MONARCH_JOB": os.path.abspath(self.path)})

    def run_ranks(self, run_id: str) -> list[dict]:
        """Every rank of one run (the runs view asks for an older run's when it is selected)."""
        r = self.query(f"SELECT run_id, rank, host, argv, pid, exit_code, signal, reason, started, ended "
                       f"FROM run_ranks WHERE run_id = '{_sql_str(run_id)}' ORDER BY rank")
        return r.table.to_pylist()

    def logs(self, run_id: str | None, limit: int = LOG_LINES) -> list[dict]:
        """The newest ``limit`` lines of a run (every line of procs too when ``run_id`` is None), oldest first."""
        where = f"WHERE run_id = '{_sql_str(run_id)}' " if run_id else ""
        # Only what can be drawn travels: a rank that prints megabyte lines would otherwise send up to
        # 128 KiB a row, thousands of rows, every second. The full length says how much was cut.
        r = self.query(f"SELECT time, host, run_id, rank, proc, stream, substr(line, 1, {MAX_LINE + 1}) AS line, "
                       f"character_length(line) AS line_chars FROM logs {where}"
                       f"ORDER BY time DESC LIMIT {int(limit)}", timeout_s=5.0)
        rows = r.table.to_pylist()
        rows.reverse()
        return rows

    def stacks(self) -> Any:
        """A fresh py-spy dump of every proc and running rank (``monarch stack``)."""
        from monarch._workbench.telemetry import stacks

        return stacks(self.record(), timeout_s=30.0)

    def stop_run(self, run_id: str) -> None:
        """Stop every rank of a run (SIGTERM, as Ctrl-C in `monarch run`)."""
        from monarch._workbench.run import signal_run

        signal_run(self.record(), run_id)

    def kill_proc(self, host: str, pid: int) -> bool:
        """SIGKILL one proc agent (its owner sees the failure); False if it was no longer running."""
        from monarch._workbench.procs import kill_proc

        return kill_proc(self.record(), host, pid)


def _sql_str(s: str) -> str:
    return s.replace("'", "''")
