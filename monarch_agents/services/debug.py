"""The host agent's debug service: ranks paused in pdb, relayed to ``monarch debug``.

Every rank the host agent starts (a command, a torchrun worker, a proc agent's actor)
gets, through its environment, the name of this service's abstract Unix socket
(``debug_rank.py`` is the other end).  A rank that hits ``breakpoint()`` connects,
registers a session, and its pdb reads and writes through it.  Who may connect is
what the kernel says of the connecting process (``SO_PEERCRED``): this user, and a
descendant of this agent (a torchrun worker is a grandchild).  No secret is handed
out: one in the ranks' environment was readable by every process they started, and
by any process of the user in ``/proc/PID/environ``.  ``monarch debug`` lists sessions (:class:`DebugList`), holds one
(:class:`DebugAttach`), and exchanges lines with it; everything between the client and
this agent goes over the job's authenticated connections, and the only socket added
is this host-local one (same user and a process this agent started, checked before anything is read).

One debugger holds a session at a time; a second is told who holds it.  A holder that
dies releases its sessions (the ranks stay paused).  A session ends when its rank
continues with no breakpoint left, quits, or exits; the holder is told which.

Output waits for a slow holder only up to :data:`WINDOW` bytes a session (the holder acknowledges what
it consumed with ``DebugAck``): then the agent stops reading the rank's socket and pdb blocks on its
write, as it would on a terminal, so a stopped ``monarch debug`` costs the agent a bounded amount.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from monarch_agents import debug_rank as proto
from monarch_agents import messages as m
from monarch_agents.services import Service

log = logging.getLogger("monarch.debug")

HOOK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_debughook")
#: Output kept for a re-attach (the output since the last command), per session.
_REPLAY_MAX = 1 << 20
_HELLO_TIMEOUT_S = 5.0
#: How many bytes of a session's output may be sent to its holder and not yet acknowledged (DebugAck):
#: then the agent stops reading the rank, so a stopped debugger costs the agent a bounded amount.
WINDOW = 16 << 20
#: How often a reader waiting for the holder looks again (an ack, a detach or a lost holder wake it at once).
_WINDOW_POLL_S = 1.0


@dataclass
class DebugSession:
    """One rank (thread) paused in pdb on this host."""

    sid: int
    sock: socket.socket
    info: dict
    started: float = field(default_factory=time.time)
    waiting: bool = False
    #: The run (or actor program) was told this rank waits (at its first prompt).
    announced: bool = False
    replay: bytearray = field(default_factory=bytearray)
    holder: str = ""
    holder_who: str = ""
    stream: m.PortRef | None = None  # the holder's port for this session's output
    unsent: bytearray = field(default_factory=bytearray)  # output read but not yet sent to the holder
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Bytes of output sent to the current holder since it attached, and how many it acknowledged.
    sent: int = 0
    acked: int = 0
    #: Woken (under the service's lock) when the holder acknowledges, changes, or the agent stops.
    progress: threading.Condition | None = None

    def send(self, kind: int, payload: bytes | dict) -> bool:
        with self.send_lock:
            try:
                proto.send_frame(self.sock, kind, payload)
                return True
            except OSError:
                return False


class DebugService(Service):
    """Debug sessions of the ranks on one host."""

    name = "debug"
    #: Its handlers only pass a line to a local socket: no thread hop between a key press and the rank.
    blocking = False

    def __init__(self, agent: Any):
        super().__init__(agent)
        self.rt = agent.rt
        self.host = agent.host
        self.host_rank = agent.host_rank
        self.sock_name = f"monarch-debug-{secrets.token_hex(8)}"
        self.sessions: dict[int, DebugSession] = {}
        self.lock = threading.Lock()
        self.next_sid = 0
        self.watched: set[str] = set()
        self.completions: dict[str, m.PortRef] = {}
        self.stopping = False
        # Listening before any child starts: a rank may stop at its first line.
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind("\0" + self.sock_name)
        self.listener.listen(64)
        self._accept_thread = threading.Thread(target=self._accept_loop, name="debug-accept", daemon=True)
        self._accept_thread.start()

    # -- the service interface -------------------------------------------------

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {m.DebugList: self.on_list, m.DebugAttach: self.on_attach, m.DebugInput: self.on_input,
                m.DebugInterrupt: self.on_interrupt, m.DebugDetach: self.on_detach, m.DebugSource: self.on_source,
                m.DebugComplete: self.on_complete, m.DebugAck: self.on_ack}

    def info(self) -> dict:
        with self.lock:
            return {"sessions": len(self.sessions)}

    def stop(self, deadline: float) -> None:
        self.stopping = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            sessions = list(self.sessions.values())
        self._wake(sessions)
        for s in sessions:
            try:
                s.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._accept_thread is not threading.current_thread():  # it ends with the listener
            self._accept_thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def place(self, cwd: str | None, env: dict) -> tuple[str | None, dict]:
        """Every child gets what its ``breakpoint()`` needs.  A PYTHONBREAKPOINT the user set for the
        run (one the agent itself was not started with) wins."""
        env = dict(env)
        env[proto.SOCK_ENV] = self.sock_name
        if env.get("PYTHONBREAKPOINT", "") in ("", os.environ.get("PYTHONBREAKPOINT", "")):
            env["PYTHONBREAKPOINT"] = "monarch_breakpoint.set_trace"
        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != HOOK_DIR]
        env["PYTHONPATH"] = os.pathsep.join([HOOK_DIR, *path])
        return cwd, env

    def sessions_info(self) -> list[dict]:
        """Every session on this host, as ``monarch debug list --json`` shows them."""
        with self.lock:
            sessions = list(self.sessions.values())
        return [self._info(s) for s in sessions]

    def telemetry_rows(self) -> list[dict]:
        """The ``debug_sessions`` table's rows (``monarch query "select * from debug_sessions"``)."""
        return [{"host": d["host"], "sid": d["sid"], "rank": d["rank"], "pid": d["pid"], "kind": d["kind"],
                 "actor": d["actor"], "command": d["command"], "run_id": d["run_id"], "file": d["file"],
                 "line": d["line"], "function": d["function"], "waiting": d["waiting"], "held_by": d["held_by"],
                 "started": int(d["started"] * 1e6)} for d in self.sessions_info()]

    def _info(self, s: DebugSession) -> dict:
        i = s.info
        return {
            "sid": s.sid, "host_rank": self.host_rank, "host": self.host, "rank": i.get("rank", 0),
            "pid": i.get("pid", 0), "name": i.get("name", ""), "actor": i.get("actor", ""),
            "command": i.get("command", ""), "coords": i.get("coords", {}), "kind": i.get("kind", "breakpoint"),
            "run_id": i.get("run_id", ""), "thread": i.get("thread", ""),
            "file": i.get("file", ""), "line": i.get("line", 0), "function": i.get("function", ""),
            "waiting": s.waiting, "held_by": s.holder_who if s.holder else "", "started": s.started,
        }

    # -- ranks ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_rank, args=(conn,), name="debug-rank", daemon=True).start()

    def _serve_rank(self, conn: socket.socket) -> None:
        session = None
        reason = ""
        try:
            pid, uid = proto.peer_cred(conn)
            if uid != os.getuid():
                log.warning("debug socket: connection from another user refused")
                return
            # The kernel's word, taken when the peer connected: a process this agent did not start
            # (another job's rank, any other program of the user) is refused before a byte is read.
            if not _descends_from(pid, os.getpid()):
                log.warning("debug socket: pid %d is no process this agent started; refused", pid)
                return
            conn.settimeout(_HELLO_TIMEOUT_S)
            got = proto.recv_frame(conn)
            if got is None or got[0] != proto.HELLO:
                return
            hello = json.loads(got[1])
            hello.pop("token", None)  # what a rank of an older monarch still sends: not needed
            hello["pid"] = pid  # who connected, not who it says it is
            conn.settimeout(None)
            with self.lock:
                sid = self.next_sid
                self.next_sid += 1
                session = DebugSession(sid, conn, hello, progress=threading.Condition(self.lock))
                self.sessions[sid] = session
            session.send(proto.WELCOME, {"sid": sid})
            # Announced at its first prompt, not here: breakpoint() registers on its own line and
            # pdb stops on the next one, which is where `list` and the notice must agree.
            while True:
                self._wait_for_holder(session)
                got = proto.recv_frame(conn)
                if got is None:
                    break
                kind, body = got
                if kind == proto.END:
                    self._flush(session, False)
                    reason = _ended(session, json.loads(body).get("reason", ""))
                    break
                self._from_rank(session, kind, body)
                if kind == proto.OUT and not select.select([conn], [], [], 0)[0]:
                    self._flush(session, False)  # nothing more right now: show what there is
        except (OSError, ValueError) as e:
            log.debug("debug session: %s", e)
        finally:
            conn.close()
            if session is not None:
                self._end(session, reason)

    def _wait_for_holder(self, s: DebugSession) -> None:
        """Until the holder is less than :data:`WINDOW` behind (or there is none, or the agent stops):
        meanwhile nothing is read from the rank, whose writes then block."""
        assert s.progress is not None
        with self.lock:
            while s.holder and s.sent - s.acked >= WINDOW and not self.stopping:
                s.progress.wait(_WINDOW_POLL_S)

    def _wake(self, sessions: list[DebugSession]) -> None:
        with self.lock:
            for s in sessions:
                if s.progress is not None:
                    s.progress.notify_all()

    def _announce(self, s: DebugSession) -> None:
        owner, run_id = self._owner_of(int(s.info.get("pid", 0)))
        if run_id:
            s.info["run_id"] = run_id
        if isinstance(owner, m.PortRef):
            if owner.addr:  # a detached run has no one to tell
                self._send(owner.addr, m.DebugWaiting(owner.port_id, run_id, self._info(s)))
        elif owner:
            self._send(owner, m.ActorDebugWaiting(self._info(s)))

    def _owner_of(self, pid: int) -> tuple[m.PortRef | str, str]:
        """Who hears that a rank waits in the debugger, and the run's id: the stream of the run (or the
        owner of the proc) that the rank's process descends from (a torchrun worker is a grandchild)."""
        agent = self.agent
        for _ in range(16):
            with agent.lock:
                child = agent.children.get(pid)
            if child is not None:
                reply = getattr(child, "reply", None)
                if child.kind == "run" and reply is not None:
                    return reply, getattr(child, "run_id", "")
                return (child.owner if child.kind == "proc" else ""), ""
            pid = _parent(pid)
            if pid <= 1:
                break
        return "", ""

    def _from_rank(self, s: DebugSession, kind: int, body: bytes) -> None:
        if kind == proto.OUT:
            # Output and the prompt that follows it usually arrive together: they leave as one message.
            with self.lock:  # with on_attach's snapshot: each byte is replayed or streamed, not both
                s.replay += body
                if len(s.replay) > _REPLAY_MAX:
                    del s.replay[:len(s.replay) - _REPLAY_MAX]
                if s.holder:
                    s.unsent += body
                big = len(s.unsent) >= proto.OUT_PIECE
            if big:  # a long output goes to the holder in pieces, not held until pdb's next prompt
                self._flush(s, False)
            return
        self._flush(s, kind == proto.READ)
        if kind == proto.READ:
            where = json.loads(body)
            with self.lock:
                if where.get("file"):
                    s.info.update(where)
                s.waiting = True
                first, s.announced = not s.announced, True
            if first:
                self._announce(s)
        elif kind == proto.SRC_REQ:
            files = json.loads(body).get("files", [])
            stream = s.stream if s.holder else None
            if stream is not None:
                self._send(stream.addr, m.DebugSourceRequest(stream.port_id, s.sid, self.host_rank, files))
            else:
                s.send(proto.SRC, {"files": {}})
        elif kind == proto.COMPLETIONS:
            msg = json.loads(body)
            with self.lock:
                port = self.completions.pop(str(msg.get("id")), None)
            if port is not None:
                self._reply(port, msg.get("matches", []))

    def _flush(self, s: DebugSession, waiting: bool) -> None:
        """Send the holder the output not sent yet (``waiting``: and that pdb now waits)."""
        with self.lock:
            stream = s.stream if s.holder else None
            data, s.unsent = bytes(s.unsent), bytearray()
            if stream is not None:
                s.sent += len(data)
            if waiting:
                s.waiting = True
        if stream is not None and (data or waiting):
            self._send(stream.addr, m.DebugOutput(stream.port_id, s.sid, self.host_rank, data, waiting))

    def _end(self, s: DebugSession, reason: str) -> None:
        reason = reason or f"rank {s.info.get('rank', '?')} exited (pid {s.info.get('pid', '?')} on {self.host})"
        with self.lock:
            self.sessions.pop(s.sid, None)
            stream = s.stream if s.holder else None
        if stream is not None:
            self._send(stream.addr, m.DebugEnded(stream.port_id, s.sid, self.host_rank, reason))

    # -- debuggers ------------------------------------------------------------------

    def on_list(self, msg: m.DebugList) -> None:
        self._reply(msg.reply, self.sessions_info())

    def on_attach(self, msg: m.DebugAttach) -> None:
        with self.lock:
            s = self.sessions.get(msg.sid)
            if s is None:
                err = f"debug session {self.host}/{msg.sid} has ended"
            elif s.holder and s.holder != msg.client and self.rt.death(s.holder) is None:
                err = (f"rank {s.info.get('rank', '?')} on {self.host} is held by another debugger "
                       f"({s.holder_who}); detach there, or wait")
            else:
                err = ""
                s.holder, s.holder_who, s.stream = msg.client, msg.who, msg.stream
                replay, waiting = bytes(s.replay), s.waiting
                s.unsent.clear()  # in the replay
                s.sent = s.acked = 0  # the new holder counts from its attach (the replay is not counted)
                if s.progress is not None:
                    s.progress.notify_all()
        if err:
            self._reply(msg.reply, RuntimeError(err), ok=False)
            return
        self._watch(msg.client)
        self._reply(msg.reply, {"replay": replay, "waiting": waiting, "info": self._info(s)})

    def _held(self, sid: int, client: str) -> DebugSession | None:
        with self.lock:
            s = self.sessions.get(sid)
        return s if s is not None and s.holder == client else None

    def on_input(self, msg: m.DebugInput) -> None:
        s = self._held(msg.sid, msg.client)
        if s is None:
            return
        s.replay.clear()
        s.waiting = False
        s.send(proto.IN, b"" if msg.eof else msg.data)

    def on_interrupt(self, msg: m.DebugInterrupt) -> None:
        s = self._held(msg.sid, msg.client)
        if s is not None:
            s.send(proto.INTR, b"")

    def on_detach(self, msg: m.DebugDetach) -> None:
        s = self._held(msg.sid, msg.client)
        if s is not None:
            with self.lock:
                s.holder = s.holder_who = ""
                s.stream = None
                if s.progress is not None:
                    s.progress.notify_all()  # no holder: its reader reads on (into the bounded replay)

    def on_ack(self, msg: m.DebugAck) -> None:
        s = self._held(msg.sid, msg.client)
        if s is None or type(msg.consumed) is not int:
            return
        with self.lock:
            if msg.consumed > s.acked:
                s.acked = msg.consumed
                if s.progress is not None:
                    s.progress.notify_all()

    def on_source(self, msg: m.DebugSource) -> None:
        with self.lock:
            s = self.sessions.get(msg.sid)
        if s is not None:
            files = {str(k): v for k, v in msg.files.items() if v is None or isinstance(v, str)}
            s.send(proto.SRC, {"files": files})

    def on_complete(self, msg: m.DebugComplete) -> None:
        with self.lock:
            s = self.sessions.get(msg.sid)
            key = secrets.token_hex(4)
            if s is not None:
                self.completions[key] = msg.reply
        if s is None or not s.send(proto.COMPLETE, {"id": key, "text": msg.text, "line": msg.line,
                                                    "begidx": msg.begidx, "endidx": msg.endidx}):
            with self.lock:
                self.completions.pop(key, None)
            self._reply(msg.reply, [])

    def _watch(self, client: str) -> None:
        with self.lock:
            if client in self.watched:
                return
            self.watched.add(client)
        self.rt.watch(client, lambda err: self._holder_lost(client))
        try:
            self.rt.mailbox.connect(client)
        except Exception as e:
            log.debug("could not connect to debugger %s: %s", client, e)

    def _holder_lost(self, client: str) -> None:
        """A debugger died while holding sessions: they stay paused, free for the next one."""
        with self.lock:
            self.watched.discard(client)
            for s in self.sessions.values():
                if s.holder == client:
                    s.holder = s.holder_who = ""
                    s.stream = None
                    if s.progress is not None:
                        s.progress.notify_all()

    # -- sending ----------------------------------------------------------------------

    def _send(self, addr: str, msg: Any) -> None:
        self.agent.send(addr, msg)

    def _reply(self, port: m.PortRef, value: Any, ok: bool = True) -> None:
        self.agent.reply(port, value, ok)


#: How many parents :func:`_descends_from` climbs (a rank under torchrun under a shell is 3 or 4 down).
_MAX_DEPTH = 64


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor``'s child, grandchild, ... (a process that outlived its parent
    is the init's or a subreaper's, and no longer this agent's)."""
    for _ in range(_MAX_DEPTH):
        pid = _parent(pid)
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _ended(s: DebugSession, why: str) -> str:
    rank = s.info.get("rank", "?")
    return {"continued": f"rank {rank} continued", "quit": f"rank {rank} quit the debugger (its program stops)",
            }.get(why, f"rank {rank}: {why}" if why else f"rank {rank} left the debugger")


def waiting_line(session: dict) -> str:
    """What a run (or an actor program) shows when one of its ranks stops in the debugger."""
    what = f"actor {session['actor']} " if session.get("actor") else ""
    where = f" at {os.path.basename(session['file'])}:{session['line']}" if session.get("file") else ""
    kind = " after an uncaught exception" if session.get("kind") == "post_mortem" else ""
    return f"{what}rank {session.get('rank', '?')} waiting in the debugger (monarch debug){kind}{where}"


def debugger_identity() -> str:
    """How a debugger is named to a second one: ``user@host pid N``."""
    import getpass

    try:
        user = getpass.getuser()
    except Exception:
        user = "?"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"
