"""Commands for ``monarch run``: start them, stream and keep their output, signal them, read logs.

Each ``RunCommand`` is one rank of a run: its stdout and stderr go, live, to the
run's reply port as ``RunOutput`` and into ``<log_dir>/runs/<run id>/<rank>.stdout``
(``.stderr``) for ``monarch logs``; then one ``RunExited`` says how it ended and a
``<rank>.exit`` file (:class:`RankExit` as JSON, written whole or not at all) marks the log
complete.  ``<rank>.order`` says in which order the two streams' bytes came: one record per
chunk, the stream (``o`` or ``e``) and the chunk's length (``<cI``), so a reader can interleave
them as a terminal showed them.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import struct
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents.files import private_dir, write_atomic
from monarch_agents.names import open_private, path_component
from monarch_agents.services import Child, Service, killpg, stop_children

log = logging.getLogger("monarch.host_agent")

#: How long the output pipes are read after the command exited (something it started may keep them open).
_EXIT_DRAIN_S = 1.0
#: How long a rank gets between SIGTERM and SIGKILL when the agent stops.
_KILL_GRACE_S = 1.0
#: The most bytes one ReadLog answers with.
_READ_LOG_MAX = 4 << 20
#: One record of ``<rank>.order``: b"o" (stdout) or b"e" (stderr), then the chunk's length.
ORDER_RECORD = struct.Struct("<cI")


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
        #: Signals that came before the zygote said the command started (a rank that fails at once
        #: makes the client stop the others while theirs may still be starting).
        self.early_signals: list[int] = []

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
        self.finish()

    def on_exited(self, code: int | None, reason: str) -> None:
        if self.service.agent.stopping.is_set():
            # The rank did not fail: the reservation is going away under it (`monarch stop`, scancel).
            reason += " (its host agent is shutting down: the reservation was released)"
        with self.lock:
            self.exit = (code if code is not None else 1, reason)
        self.finish()

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
        self.ended(code, reason)
        if self.reply.addr:
            self.service.agent.send(self.reply.addr, m.RunExited(self.reply.port_id, self.run_id, self.rank, code, reason))
        self.service.finished(self)

    def ended(self, code: int, reason: str) -> None:
        """Called once, before ``RunExited`` goes out."""


class _Run(CommandChild):
    def __init__(self, service: "RunsService", msg: m.RunCommand, run_dir: str):
        super().__init__("run", service, msg.run_id, msg.rank, msg.reply, list(msg.argv), msg.owner)
        self.run_dir = run_dir
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
        try:
            # Whole or not at all: `monarch logs --list` may read it at any moment.  No fsync: it is
            # on the path of every run's end, and a reader does without it (the run shows "exit ?").
            write_atomic(os.path.join(self.run_dir, f"{self.rank}.exit"),
                         RankExit(code, reason, time.time()).to_bytes(), durable=False)
        except OSError as e:
            log.warning("could not write the exit file of run %s rank %d: %s", self.run_id, self.rank, e)


class RunsService(Service):
    """The ranks of ``monarch run`` on this host, and their logs."""

    name = "runs"

    def __init__(self, agent: Any):
        super().__init__(agent)
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.runs: dict[str, _Run] = {}  # run id -> its rank here, until it finished

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {m.RunCommand: self.on_run, m.SignalRun: self.on_signal_run, m.ReadLog: self.on_read_log}

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
            self.done.notify_all()

    # -- messages ------------------------------------------------------------

    def on_run(self, msg: m.RunCommand) -> None:
        agent = self.agent
        if type(msg.rank) is not int or msg.rank < 0:  # it names the rank's log files
            log.warning("refused a run with rank %r", msg.rank)
            return
        if msg.owner:
            agent.track_owner(msg.owner)
        run_dir = os.path.join(agent.log_dir, "runs", path_component(msg.run_id))
        private_dir(run_dir, top=agent.log_dir)
        run = _Run(self, msg, run_dir)
        with open_private(os.path.join(run_dir, f"{msg.rank}.json"), "w") as f:
            json.dump({"argv": msg.argv, "rank": msg.rank, "host": agent.host, "started": run.started}, f)
        cwd, env = agent.place_child(msg.cwd, agent.child_env(msg.env))
        # A writable place of the rank's own, per run and host (the workspace is read-only): kept
        # beside its logs, listed by `monarch logs --list`, fetched by `monarch logs --output DIR`.
        output_dir = os.path.join(run_dir, OUTPUT_DIR)
        private_dir(output_dir, top=agent.log_dir)
        env.setdefault("MONARCH_OUTPUT_DIR", output_dir)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        with self.lock:
            self.runs[msg.run_id] = run
        if agent.telemetry is not None:
            agent.telemetry.rank_started(msg.run_id, msg.rank, msg.argv, msg.cwd)
        try:
            agent.start_child({"kind": "exec", "argv": list(msg.argv), "env": env, "cwd": cwd}, [out_w, err_w], run)
        finally:
            os.close(out_w)
            os.close(err_w)
        threading.Thread(target=self._pump, args=(run, {out_r: "stdout", err_r: "stderr"}),
                         name=f"pump-{msg.run_id}", daemon=True).start()

    def _pump(self, run: _Run, fds: dict[int, str]) -> None:
        sel = selectors.DefaultSelector()
        files = {s: open_private(run.log_paths[s]) for s in ("stdout", "stderr", "order")}
        for fd, stream in fds.items():
            sel.register(fd, selectors.EVENT_READ, stream)
        open_fds = set(fds)
        tel = self.agent.telemetry
        try:
            while open_fds:
                exit_seen = run.exit is not None
                events = sel.select(timeout=_EXIT_DRAIN_S if exit_seen else None)
                if not events and exit_seen:
                    break  # the command exited but something it started keeps the pipe open
                for key, _ in events:
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        open_fds.discard(key.fd)
                        continue
                    files[key.data].write(data)
                    files[key.data].flush()
                    if tel is not None:
                        tel.rank_output(run.run_id, run.rank, key.data, data)
                    files["order"].write(ORDER_RECORD.pack(b"o" if key.data == "stdout" else b"e", len(data)))
                    files["order"].flush()
                    if run.reply.addr:
                        self.agent.send(run.reply.addr, m.RunOutput(run.reply.port_id, run.run_id, run.rank, key.data, data))
        finally:
            for fd in open_fds:
                os.close(fd)
            for f in files.values():
                f.close()
            sel.close()
        run.pumped()

    def on_signal_run(self, msg: m.SignalRun) -> None:
        with self.lock:
            run = self.runs.get(msg.run_id)
        if run is not None:
            run.signal(msg.signum)

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
                done = os.path.exists(os.path.join(run_dir, f"{rank_s}.exit"))
                with open(os.path.join(run_dir, name), "rb") as f:
                    f.seek(msg.offset)
                    data = f.read(_READ_LOG_MAX)
                result[int(rank_s)] = (data, done)
        except FileNotFoundError:
            pass
        self.agent.reply(msg.reply, result)
