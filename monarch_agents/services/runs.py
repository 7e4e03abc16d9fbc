"""Commands for ``monarch run``: start them, stream and keep their output, signal them, read logs.

Each ``RunCommand`` is one rank of a run: its stdout and stderr go, live, to the
run's reply port as ``RunOutput`` and into ``<log_dir>/runs/<run id>/<rank>.stdout``
(``.stderr``) for ``monarch logs``; then one ``RunExited`` says how it ended and a
``<rank>.exit`` file (:class:`RankExit` as JSON, written whole or not at all) marks the log
complete.  ``<rank>.order`` says in which order the two streams' bytes came: one record per
chunk, the stream (``o`` or ``e``) and the chunk's length (``<cI``), so a reader can interleave
them as a terminal showed them.  A rank's log is kept under a cap (``MONARCH_RUN_LOG_MAX``, 256 MiB
by default): its head and its tail, with a note between them (``monarch_agents.logcap``).

Faults end runs, never hang them.  A log that cannot be written (the disk is full, the folder was
removed) stops being written, but the rank runs on, its output still streams to the client, and its
``RunExited`` says why its log is incomplete.  Output waits for a slow client only up to
:data:`WINDOW` bytes a rank (the client acknowledges what it consumed with ``RunAck``): then the
agent stops reading the rank's pipes and the rank blocks on its writes, as it would on a terminal,
so a stopped client costs the agent a bounded amount of memory.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents.files import private_dir, write_atomic
from monarch_agents.logcap import ORDER_RECORD, CappedLog, log_cap  # noqa: F401  (ORDER_RECORD: the format's, re-exported)
from monarch_agents.names import open_private, path_component
from monarch_agents.services import Child, Service, killpg, stop_children

log = logging.getLogger("monarch.host_agent")

#: How a rank that never started says so (``monarch._workbench.run.NOT_STARTED``).
NOT_STARTED = "could not start"
#: How long the output pipes are read after the command exited (something it started may keep them open).
_EXIT_DRAIN_S = 1.0
#: How long a rank gets between SIGTERM and SIGKILL when the agent stops.
_KILL_GRACE_S = 1.0
#: The most bytes one ReadLog answers with.
_READ_LOG_MAX = 4 << 20
#: How many bytes of a rank's output may be sent and not yet acknowledged by the client (RunAck).
WINDOW = 16 << 20
#: How often the pump looks again while it waits for the client (its rank exiting wakes it at once).
_WINDOW_POLL_S = 1.0
#: How many ended ranks' exits the agent remembers for ``monarch logs`` when their exit files could not be written.
_KEEP_EXITS = 1024


#: The folder of a run's folder that its ranks write to (``$MONARCH_OUTPUT_DIR``).
OUTPUT_DIR = "output"


@dataclass
class RankExit:
    """How a rank ended: the content of its ``<rank>.exit`` file."""

    code: int
    reason: str
    ended: float

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def parse(cls, data: bytes) -> "RankExit | None":
        """The exit file's record; None if it is empty or not one (damaged: the disk filled, say)."""
        try:
            d = json.loads(data)
            return cls(int(d["code"]), str(d.get("reason", "")), float(d["ended"]))
        except (ValueError, TypeError, KeyError):
            return None


class CommandChild(Child):
    """A command whose output is pumped to its reply address; it finishes (``RunExited``) once it
    exited and its output was read to the end.  Shared by runs and shells."""

    def __init__(self, kind: str, service: Any, run_id: str, rank: int, reply: m.PortRef, argv: list, owner: str):
        super().__init__(kind, owner)
        self.service = service
        self.run_id = run_id
        self.rank = rank
        self.reply = reply
        self.argv = argv
        self.started = time.time()
        self.exit: tuple[int, str] | None = None
        self.pumping = True
        self.sent_exit = False
        self.lock = threading.Lock()
        #: Woken when the client acknowledges output or the command exits (the pump may wait on it).
        self.progress = threading.Condition(self.lock)
        self.sent_bytes = 0
        self.acked_bytes = 0
        #: Why this rank's log is incomplete ('' while it is whole).
        self.log_error = ""
        #: Signals that came before the zygote said the command started (a rank that fails at once
        #: makes the client stop the others while theirs may still be starting).
        self.early_signals: list[int] = []
        #: Where the end goes instead of a RunExited on ``reply`` (``RunCommand.exit_to``): a fan-out tree's
        #: ports, every one that asked (a subtree sent again, or straight, after its forwarder was slow or lost).
        self.exit_to: list[m.PortRef] = []

    def on_started(self, pid: int) -> None:
        with self.lock:
            early, self.early_signals = self.early_signals, []
        for signum in early:
            killpg(pid, signum)

    def signal(self, signum: int) -> None:
        with self.lock:
            if self.exit is not None or self.exited is not None:
                return
            if not self.pid:
                self.early_signals.append(signum)  # delivered by on_started
                return
        killpg(self.pid, signum)

    def on_failed(self, error: str) -> None:
        with self.lock:
            self.exit = (127, f"could not start: {error}")
            self.pumping = False
            self.progress.notify_all()
        self.finish()

    def on_exited(self, code: int | None, reason: str) -> None:
        if self.service.agent.stopping.is_set():
            # The rank did not fail: the reservation is going away under it (`monarch stop`, scancel).
            reason += " (its host agent is shutting down: the reservation was released)"
        with self.lock:
            self.exit = (code if code is not None else 1, reason)
            self.progress.notify_all()
        self.finish()

    def acked(self, consumed: int) -> None:
        """The client has consumed ``consumed`` bytes of this rank's output in all."""
        with self.lock:
            if consumed > self.acked_bytes:
                self.acked_bytes = consumed
                self.progress.notify_all()

    def wait_for_client(self) -> None:
        """Until the client is less than :data:`WINDOW` behind, or the command exited (what is left in
        its pipes is then bounded: read it all, so the run can end)."""
        with self.lock:
            while self.sent_bytes - self.acked_bytes >= WINDOW and self.exit is None and self.reply.addr:
                self.progress.wait(_WINDOW_POLL_S)

    def pumped(self) -> None:
        """Its output was read to the end."""
        with self.lock:
            self.pumping = False
        self.finish()

    def finish(self) -> None:
        with self.lock:
            if self.sent_exit or self.exit is None or self.pumping:
                return
            self.sent_exit = True
        code, reason = self.exit
        try:
            self.ended(code, reason)
        except Exception:  # the client must hear of the end whatever happened here
            log.exception("run %s rank %d: ending", self.run_id, self.rank)
        with self.lock:
            exit_to = list(self.exit_to)
        for port in exit_to:
            self.service.agent.send(port.addr, m.Reply(port.port_id, self.rank, True, self.end_report()))
        if not exit_to and self.reply.addr:
            self.service.agent.send(self.reply.addr, m.RunExited(self.reply.port_id, self.run_id, self.rank, code,
                                                                 reason, self.log_error))
        self.service.finished(self)

    def end_report(self) -> tuple:
        """How it ended, as an ``exit_to`` Reply carries it: (code, reason, log_error, output bytes sent)."""
        code, reason = self.exit or (1, "")
        return (code, reason, self.log_error, self.sent_bytes)

    def ended(self, code: int, reason: str) -> None:
        """Called once, before ``RunExited`` goes out."""


class _Run(CommandChild):
    def __init__(self, service: "RunsService", msg: m.RunCommand, run_dir: str):
        super().__init__("run", service, msg.run_id, msg.rank, msg.reply, list(msg.argv), msg.owner)
        self.run_dir = run_dir
        #: What the client set for this rank (``MONARCH_RUN_LOG_MAX`` may be among it).
        self.env = dict(msg.env or {})
        self.log_paths = {s: os.path.join(run_dir, f"{msg.rank}.{s}") for s in ("stdout", "stderr", "order")}

    def on_started(self, pid: int) -> None:
        super().on_started(pid)
        tel = self.service.agent.telemetry
        if tel is not None:
            tel.rank_pid(self.run_id, self.rank, pid)

    def ended(self, code: int, reason: str) -> None:
        tel = self.service.agent.telemetry
        if tel is not None:
            tel.rank_ended(self.run_id, self.rank, code, reason)
        record = RankExit(code, reason, time.time())
        self.service.remember_exit(self.run_id, self.rank, record)
        try:
            # Whole or not at all: `monarch logs --list` may read it at any moment.  No fsync: it is
            # on the path of every run's end, and a reader does without it (the run shows "exit ?").
            write_atomic(os.path.join(self.run_dir, f"{self.rank}.exit"), record.to_bytes(), durable=False)
        except OSError as e:
            # The agent still answers ReadLog with it (remember_exit), so `logs --list` shows the end.
            log.warning("could not write the exit file of run %s rank %d: %s", self.run_id, self.rank, e)


class RunsService(Service):
    """The ranks of ``monarch run`` on this host, and their logs."""

    name = "runs"

    def __init__(self, agent: Any):
        super().__init__(agent)
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.runs: dict[str, _Run] = {}  # run id -> its rank here, until it finished
        self.exits: dict[tuple[str, int], RankExit] = {}  # (run id, rank) -> how it ended, the latest ones
        #: (run id, rank) -> its end report (see CommandChild.end_report), for a fan-out that asks again.
        self.reports: dict[tuple[str, int], tuple] = {}

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {m.RunCommand: self.on_run, m.SignalRun: self.on_signal_run, m.ReadLog: self.on_read_log,
                m.RunAck: self.on_ack}

    def info(self) -> dict:
        with self.lock:
            runs = [{"run_id": r.run_id, "rank": r.rank, "pid": r.pid, "argv": r.argv, "started": r.started}
                    for r in self.runs.values() if r.exit is None]
        return {"runs": runs}

    def stop(self, deadline: float) -> None:
        with self.lock:
            runs = list(self.runs.values())
        stop_children(self.agent, runs, deadline, _KILL_GRACE_S)
        # Their RunExited (with the reason) goes out once the output is read to the end.
        with self.done:
            self.done.wait_for(lambda: not self.runs, max(0.0, deadline - time.monotonic()))

    def finished(self, run: CommandChild) -> None:
        with self.done:
            if self.runs.get(run.run_id) is run:
                del self.runs[run.run_id]
            self.reports[(run.run_id, run.rank)] = run.end_report()
            while len(self.reports) > _KEEP_EXITS:
                del self.reports[next(iter(self.reports))]
            idle = not self.runs
            self.done.notify_all()
        if idle:
            release_memory()

    def remember_exit(self, run_id: str, rank: int, record: RankExit) -> None:
        """Keep how a rank ended, for ReadLog, in case its exit file cannot be written (a full disk)."""
        with self.lock:
            self.exits[(run_id, rank)] = record
            while len(self.exits) > _KEEP_EXITS:
                del self.exits[next(iter(self.exits))]

    def _again(self, msg: m.RunCommand) -> bool:
        """A rank this agent has started already (a fan-out tree sends a subtree again when the agent
        that forwarded it died): its end goes to the new ``exit_to`` too; True when it was one."""
        with self.lock:
            run = self.runs.get(msg.run_id)
            if run is not None and run.rank == msg.rank:
                with run.lock:
                    if not run.sent_exit:
                        if isinstance(msg.exit_to, m.PortRef) and msg.exit_to not in run.exit_to:
                            run.exit_to.append(msg.exit_to)
                        return True
                report = run.end_report()
            else:
                report = self.reports.get((msg.run_id, msg.rank))
                if report is None:
                    return False
        if msg.exit_to is not None:
            self.agent.send(msg.exit_to.addr, m.Reply(msg.exit_to.port_id, msg.rank, True, report))
        return True

    # -- messages ------------------------------------------------------------

    def on_run(self, msg: m.RunCommand) -> None:
        agent = self.agent
        if type(msg.rank) is not int or msg.rank < 0:  # it names the rank's log files
            log.warning("refused a run with rank %r", msg.rank)
            if isinstance(msg.exit_to, m.PortRef):  # a tree waits for every rank's end: it hears this one's
                agent.send(msg.exit_to.addr, m.Reply(msg.exit_to.port_id, 0, True,
                                                     (127, f"{NOT_STARTED}: rank {msg.rank!r} is not a rank", "", 0)))
            return
        if self._again(msg):
            return
        if msg.owner:
            agent.track_owner(msg.owner)
        run_dir = os.path.join(agent.log_dir, "runs", path_component(msg.run_id))
        run = _Run(self, msg, run_dir)
        run.exit_to = [msg.exit_to] if isinstance(msg.exit_to, m.PortRef) else []
        try:
            # A folder that is not safely ours (UnsafeFolder) or cannot be made: the run goes on with
            # nothing written there, and its end says why.
            private_dir(run_dir, top=agent.log_dir)
            with open_private(os.path.join(run_dir, f"{msg.rank}.json"), "w") as f:
                json.dump({"argv": msg.argv, "rank": msg.rank, "host": agent.host, "started": run.started}, f)
        except OSError as e:
            # The run goes on without its log: its output still streams, and its end says why.
            run.log_error = _log_error(run_dir, e)
            log.warning("run %s rank %d: %s", msg.run_id, msg.rank, run.log_error)
        with self.lock:
            self.runs[msg.run_id] = run
        try:
            cwd, env = agent.place_child(msg.cwd, agent.child_env(msg.env))
            # A writable place of the rank's own, per run and host (the workspace is read-only): kept
            # beside its logs, listed by `monarch logs --list`, fetched by `monarch logs --output DIR`.
            output_dir = os.path.join(run_dir, OUTPUT_DIR)
            try:
                private_dir(output_dir, top=agent.log_dir)
                env.setdefault("MONARCH_OUTPUT_DIR", output_dir)
            except OSError as e:  # a full disk: the rank runs without one (and says so if it needs it)
                log.warning("run %s rank %d: no output folder: %s", msg.run_id, msg.rank, e)
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
        except Exception as e:  # out of fds, say: the client hears it instead of waiting forever
            run.on_failed(f"{type(e).__name__}: {e}")
            return
        if agent.telemetry is not None:
            agent.telemetry.rank_started(msg.run_id, msg.rank, msg.argv, msg.cwd)
        try:
            agent.start_child({"kind": "exec", "argv": list(msg.argv), "env": env, "cwd": cwd}, [out_w, err_w], run)
        except Exception as e:
            os.close(out_r)
            os.close(err_r)
            run.on_failed(f"{type(e).__name__}: {e}")
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        threading.Thread(target=self._pump, args=(run, {out_r: "stdout", err_r: "stderr"}),
                         name=f"pump-{msg.run_id}", daemon=True).start()

    def _pump(self, run: _Run, fds: dict[int, str]) -> None:
        """Read the rank's pipes to the end: into its log (while that can be written) and to the client
        (never more than WINDOW ahead of it).  Whatever fails, the rank's end is reported."""
        sel = selectors.DefaultSelector()
        logs = _RankLog(run, run.env)
        open_fds = set(fds)
        tel = self.agent.telemetry
        try:
            for fd, stream in fds.items():
                sel.register(fd, selectors.EVENT_READ, stream)
            while open_fds:
                run.wait_for_client()
                exit_seen = run.exit is not None
                events = sel.select(timeout=_EXIT_DRAIN_S if exit_seen else _WINDOW_POLL_S)
                if not events and exit_seen:
                    break  # the command exited but something it started keeps the pipe open
                for key, _ in events:
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        open_fds.discard(key.fd)
                        continue
                    logs.write(key.data, data)
                    if tel is not None:
                        try:
                            tel.rank_output(run.run_id, run.rank, key.data, data)
                        except Exception:
                            log.exception("run %s rank %d: telemetry", run.run_id, run.rank)
                            tel = None
                    if run.reply.addr:
                        with run.lock:
                            run.sent_bytes += len(data)
                        self.agent.send(run.reply.addr, m.RunOutput(run.reply.port_id, run.run_id, run.rank, key.data, data))
        except Exception:
            log.exception("run %s rank %d: reading its output", run.run_id, run.rank)
        finally:
            for fd in open_fds:
                os.close(fd)
            logs.close()
            sel.close()
            run.pumped()

    def on_signal_run(self, msg: m.SignalRun) -> None:
        with self.lock:
            run = self.runs.get(msg.run_id)
        if run is not None:
            run.signal(msg.signum)

    def on_ack(self, msg: m.RunAck) -> None:
        with self.lock:
            run = self.runs.get(msg.run_id)
        if run is not None and run.rank == msg.rank and type(msg.consumed) is int:
            run.acked(msg.consumed)

    def _ended(self, run_id: str, rank: int) -> bool:
        with self.lock:
            return (run_id, rank) in self.exits

    def on_read_log(self, msg: m.ReadLog) -> None:
        run_dir = os.path.join(self.agent.log_dir, "runs", path_component(msg.run_id))
        result: dict[int, Any] = {}
        try:
            for name in os.listdir(run_dir):
                rank_s, _, kind = name.partition(".")
                if kind != msg.stream or not rank_s.isdigit():
                    continue
                # Done is looked at before reading: the exit file is written after the last byte,
                # so "done" with the bytes read means nothing is left beyond them.
                done = os.path.exists(os.path.join(run_dir, f"{rank_s}.exit")) or self._ended(msg.run_id, int(rank_s))
                with open(os.path.join(run_dir, name), "rb") as f:
                    f.seek(msg.offset)
                    data = f.read(_READ_LOG_MAX)
                result[int(rank_s)] = (data, done)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("ReadLog of run %s: %s", msg.run_id, e)
        if msg.stream == "exit":
            # Exits whose file could not be written (the disk was full) are still known here.
            with self.lock:
                known = [(rank, ex) for (run_id, rank), ex in self.exits.items() if run_id == msg.run_id]
            for rank, ex in known:
                if rank not in result or not result[rank][0]:
                    data = ex.to_bytes()[msg.offset:]
                    result[rank] = (data, True)
        self.agent.reply(msg.reply, result)


def _log_error(path: str, e: OSError) -> str:
    return f"its log is incomplete: {e.strerror or e} ({path})"


class _RankLog:
    """A rank's log files, written while they can be, under its cap (``monarch_agents.logcap``): the
    first write that fails (ENOSPC, EIO, a removed folder) stops all of them and notes why in
    ``run.log_error``; it never raises.  A log cut at its cap says so there too, once."""

    def __init__(self, run: _Run, env: dict):
        self.run = run
        self.log: CappedLog | None = None
        cap, problem = log_cap(env, os.environ)
        if problem:  # a bad MONARCH_RUN_LOG_MAX: the default cap applies, and the run's end says so
            log.warning("run %s rank %d: %s", run.run_id, run.rank, problem)
            self.problem = problem
        else:
            self.problem = ""
        if run.log_error:
            return
        try:
            self.log = CappedLog(run.log_paths["stdout"][:-len(".stdout")], cap)
        except OSError as e:
            self.fail(e, run.log_paths["stdout"])

    def write(self, stream: str, data: bytes) -> None:
        if self.log is None:
            return
        truncated = self.log.truncated
        try:
            self.log.write(stream, data)
        except OSError as e:
            self.fail(e, self.run.log_paths[stream])
            return
        if not truncated and self.log.truncated:
            log.warning("run %s rank %d: its log reached its cap of %d bytes: keeping its tail only from here",
                        self.run.run_id, self.run.rank, self.log.cap)

    def fail(self, e: OSError, path: str) -> None:
        self.run.log_error = _log_error(path, e)
        log.warning("run %s rank %d: %s", self.run.run_id, self.run.rank, self.run.log_error)
        self.close()

    def close(self) -> None:
        capped, self.log = self.log, None
        if capped is None:
            return
        note = capped.note()
        try:
            capped.close()
        except OSError as e:
            self.fail(e, self.run.log_paths["stdout"])
            return
        if note or self.problem:
            self.run.log_error = self.run.log_error or "; ".join(x for x in (note, self.problem) if x)


def release_memory() -> None:
    """Give the memory freed by the last run back to the system.  A run streaming fast leaves the
    heap fragmented by its 64 KiB chunks, which glibc keeps (the agent stayed ~100 MB above its
    resting size after a client stopped mid-run went); malloc_trim returns the free pages."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes

        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):  # not glibc
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None
