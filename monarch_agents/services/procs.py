"""Proc agents: start them (forked from the warm zygote), list them, stop them, report deaths.

``SpawnProcs`` starts ``count`` proc agents owned by a client; the answer (one
``ProcInfo`` each) goes out once every one has reported its address with
``ProcReady``.  A proc that dies before that fails the whole spawn with its exit
status; one that dies later is reported to its owner as ``ProcDied`` at once.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents.names import path_component
from monarch_agents.services import Child, Service, killpg, stop_children

#: How long stopped procs get between SIGTERM and SIGKILL.
_KILL_GRACE_S = 1.0
#: The longest grace a client may ask for in StopProcs (a day: a bad value never leaves procs forever).
_KILL_GRACE_MAX_S = 86400.0
#: After a StopProcs' SIGKILL, how long its answer may still wait for the procs to be reaped.
_STOP_ANSWER_MARGIN_S = 2.0


@dataclass
class _PendingSpawn:
    msg: m.SpawnProcs
    infos: list


class _Proc(Child):
    def __init__(self, service: "ProcsService", msg: m.SpawnProcs, token: str, slot: int, pending: _PendingSpawn):
        orphan = msg.orphan_s
        super().__init__("proc", msg.owner, None if orphan is None else max(0.0, float(orphan)))
        self.service = service
        self.mesh_id = msg.mesh_id
        self.token = token
        self.slot = slot
        self.pending: _PendingSpawn | None = pending
        self.addr = ""
        self.abandoned = False  # its spawn failed (a sibling died): it is killed as soon as it runs

    def on_started(self, pid: int) -> None:
        if self.abandoned:
            killpg(pid, signal.SIGKILL)
        tel = self.service.agent.telemetry
        if tel is not None:
            tel.proc_started(pid, self.mesh_id)

    def on_failed(self, error: str) -> None:
        self.service.spawn_failed(self, error)

    def on_exited(self, code: int | None, reason: str) -> None:
        tel = self.service.agent.telemetry
        if tel is not None:
            tel.proc_ended(self.pid, code, reason)
        self.service.exited(self, code, reason)


@dataclass(eq=False)
class _StopWaiter:
    """A StopProcs whose answer waits for its procs (by token) to exit."""

    left: set[str]
    reply: Any
    count: int
    answered: bool = False


class ProcsService(Service):
    """The proc agents of every mesh on this host."""

    name = "procs"
    #: An actor may spawn and stop procs on its own host (``this_host()`` in an actor), not on another.
    from_local_procs = frozenset({m.SpawnProcs, m.StopProcs})

    def __init__(self, agent: Any):
        super().__init__(agent)
        self.lock = threading.Lock()
        self.procs: dict[str, _Proc] = {}  # token -> proc, from the request until it exits
        self.stop_waiters: list[_StopWaiter] = []  # StopProcs answered once their procs exited

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {m.SpawnProcs: self.on_spawn_procs, m.ProcReady: self.on_proc_ready, m.StopProcs: self.on_stop_procs,
                m.KillProc: self.on_kill_proc}

    def info(self) -> dict:
        with self.lock:
            procs = [{"pid": p.pid, "mesh": p.mesh_id, "addr": p.addr, "owner": p.owner}
                     for p in self.procs.values() if p.pid and p.exited is None]
        return {"procs": procs}

    def stop(self, deadline: float) -> None:
        with self.lock:
            procs = list(self.procs.values())
        stop_children(self.agent, procs, deadline, _KILL_GRACE_S)

    # -- messages ------------------------------------------------------------

    def on_spawn_procs(self, msg: m.SpawnProcs) -> None:
        agent = self.agent
        agent.track_owner(msg.owner)
        pending = _PendingSpawn(msg, [None] * msg.count)
        cwd, env = agent.place_child(agent.owner_cwd(msg.owner), agent.child_env(msg.env))
        per_proc = msg.per_proc if isinstance(msg.per_proc, list) and len(msg.per_proc) == msg.count else None
        for i in range(msg.count):
            token = uuid.uuid4().hex
            proc = _Proc(self, msg, token, i, pending)
            with self.lock:
                self.procs[token] = proc
            config = {
                "keys": agent.keys.for_procs().as_dict(),  # user code gets no client or host agent secret
                "host_agent": agent.rt.addr,
                "host": agent.host,
                "host_rank": agent.host_rank,
                "bind_host": agent.rt.mailbox.bind_host,
                "token": token,
                "mesh_id": msg.mesh_id,
                "owner": msg.owner,
                "env": msg.env,
            }
            fds = agent.stdio_for(f"procs/{path_component(msg.mesh_id)}-{i}.log", msg.owner)
            own = per_proc[i] if per_proc is not None and isinstance(per_proc[i], dict) else {}
            proc_env = env
            if own.get("env"):
                proc_env = dict(env)
                for k, v in own["env"].items():
                    if v is None:
                        proc_env.pop(str(k), None)
                    else:
                        proc_env[str(k)] = str(v)
            python = own.get("python")
            try:
                if isinstance(python, str) and python:
                    started = self._exec_proc(python, config, proc_env, cwd, fds, proc)
                else:
                    started = self._start(proc, {"kind": "proc", "config": config, "env": proc_env, "cwd": cwd}, fds)
                if not started:
                    return  # the spawn failed as a whole: the procs after this one are not started
            finally:
                for fd in fds:
                    if fd > 2:
                        os.close(fd)

    def _exec_proc(self, python: str, config: dict, env: dict, cwd: str | None, fds: list[int], proc: _Proc) -> bool:
        """Start a proc under another interpreter: ``python -m monarch_agents.proc_exec``, its
        configuration (keys among it) on its stdin, never in its arguments or environment.  False
        when it could not be handed over (the spawn is failed then).

        The configuration is written whole into the pipe before the proc exists, and the pipe is
        grown to hold it: written after the start, a configuration bigger than a pipe (the
        client's environment rides in it) would block this thread until the proc reads, forever
        if the program never does, and one that exited at once would raise BrokenPipeError here."""
        data = json.dumps(config).encode()
        r, w = os.pipe()
        try:
            try:
                _fill_pipe(w, data)
            except OSError as e:
                proc.on_failed(f"its configuration ({len(data)} bytes) does not fit in a pipe: {e.strerror or e}")
                return False
            finally:
                os.close(w)
            return self._start(proc, {"kind": "exec", "argv": [python, "-m", "monarch_agents.proc_exec"], "env": env,
                                      "cwd": cwd}, [r, *fds[:2]])
        finally:
            os.close(r)

    def _start(self, proc: _Proc, request: dict, fds: list[int]) -> bool:
        """Hand ``request`` to the zygote; False when it could not be (the spawn is failed then, in
        one line, instead of left unanswered: the request is one datagram, and an environment of a
        few hundred KiB is more than the zygote's socket takes)."""
        try:
            self.agent.start_child(request, fds, proc)
        except OSError as e:
            why = e.strerror or str(e)
            if e.errno == errno.EMSGSIZE:
                why += " (the environment handed to the procs is too large)"
            proc.on_failed(f"could not ask this host's zygote to start it: {why}")
            return False
        return True

    def on_proc_ready(self, msg: m.ProcReady) -> None:
        with self.lock:
            proc = self.procs.get(msg.token)
            if proc is None or proc.exited is not None or proc.pending is None:
                return  # it died (and failed its spawn) before its report was read
            proc.addr = msg.addr
            pending, proc.pending = proc.pending, None
            pending.infos[proc.slot] = m.ProcInfo(msg.addr, msg.pid, self.agent.host, self.agent.host_rank)
            complete = all(i is not None for i in pending.infos)
        if complete:
            self.agent.reply(pending.msg.reply, pending.infos)

    def on_stop_procs(self, msg: m.StopProcs) -> None:
        grace = getattr(msg, "grace_s", None)  # a client of an older version sends none
        if not isinstance(grace, (int, float)) or not 0 <= grace <= _KILL_GRACE_MAX_S:
            grace = _KILL_GRACE_S
        with self.lock:
            victims = [p for p in self.procs.values() if p.mesh_id == msg.mesh_id and p.pid and p.exited is None]
            # As in Monarch, the answer comes once the procs have exited (and were reaped): a
            # client's stop().get() returns with its procs gone, not while they are still ending.
            waiting = _StopWaiter({p.token for p in victims}, msg.reply, len(victims))
            if victims and msg.reply is not None:
                self.stop_waiters.append(waiting)
        for p in victims:
            killpg(p.pid, signal.SIGTERM)
        if victims:
            def force() -> None:
                for p in victims:
                    if p.exited is None:
                        killpg(p.pid, signal.SIGKILL)
            self.agent.rt.mailbox.call_later(grace, force)
            # Whatever happens to them, the asker hears back shortly after the SIGKILL.
            self.agent.rt.mailbox.call_later(grace + _STOP_ANSWER_MARGIN_S, lambda: self._answer_stop(waiting))
        else:
            self._answer_stop(waiting)

    def _answer_stop(self, waiting: "_StopWaiter") -> None:
        with self.lock:
            if waiting.answered:
                return
            waiting.answered = True
            if waiting in self.stop_waiters:
                self.stop_waiters.remove(waiting)
        if waiting.reply is not None:
            self.agent.reply(waiting.reply, waiting.count)

    def on_kill_proc(self, msg: m.KillProc) -> None:
        # Only a proc of this agent: the pid comes from a client, and a pid of anything else is not ours to signal.
        with self.lock:
            found = any(p.pid == msg.pid and p.exited is None for p in self.procs.values())
        if found:
            killpg(msg.pid, msg.signum)
        if msg.reply is not None:
            self.agent.reply(msg.reply, found)

    # -- children --------------------------------------------------------------

    def exited(self, proc: _Proc, code: int | None, reason: str) -> None:
        # Kill anything the proc left in its process group.
        killpg(proc.pid, signal.SIGKILL)
        with self.lock:
            self.procs.pop(proc.token, None)
            reported = bool(proc.addr)
            for w in self.stop_waiters:
                w.left.discard(proc.token)
            done = [w for w in self.stop_waiters if not w.left]
        for w in done:
            self._answer_stop(w)
        if reported:
            self.agent.send(proc.owner, m.ProcDied(proc.addr, proc.pid, self.agent.host, reason, code))
        else:
            self.spawn_failed(proc, reason)

    def spawn_failed(self, proc: _Proc, reason: str) -> None:
        """Fail the whole spawn ``proc`` was part of (once), and stop the others of it."""
        with self.lock:
            self.procs.pop(proc.token, None)
            pending = proc.pending
            if pending is None:
                return
            siblings = [p for p in self.procs.values() if p.pending is pending]
            for p in (proc, *siblings):
                p.pending = None
            for p in siblings:
                p.abandoned = True
        for p in siblings:
            if p.pid:
                killpg(p.pid, signal.SIGKILL)
        self.agent.reply(pending.msg.reply, RuntimeError(f"proc on {self.agent.host} failed to start: {reason}"),
                         ok=False)


def _fill_pipe(w: int, data: bytes) -> None:
    """Write all of ``data`` into the empty pipe ``w`` without waiting for a reader: the pipe is
    grown to hold it (up to /proc/sys/fs/pipe-max-size); OSError if it cannot be."""
    import fcntl

    os.set_blocking(w, False)
    if len(data) > 4096:
        size = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
        if size < len(data):
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, len(data))
    if os.write(w, data) != len(data):
        raise OSError(errno.EMSGSIZE, "the pipe took only part of it")
