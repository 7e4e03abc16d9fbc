"""The client side of ``monarch debug``: find the job's debug sessions and hold one.

:func:`list_sessions` is the small call other tools (a dashboard) use; :class:`DebugClient`
is what the ``monarch debug`` prompt drives: it numbers sessions stably for its lifetime,
attaches (one holder per session, job-wide), and relays lines, Ctrl-C, Ctrl-D and
source files between this terminal and the rank's pdb through the host agents.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from dataclasses import dataclass, field
from typing import Any

from monarch_agents.services.debug import waiting_line  # noqa: F401  (the line a run shows; for the CLI)
from monarch.errors import MonarchError
from monarch._workbench.state import JobRecord

log = logging.getLogger("monarch.debug")

_LIST_TIMEOUT_S = 3.0
_ATTACH_TIMEOUT_S = 5.0
_COMPLETE_TIMEOUT_S = 1.0
#: The holder acknowledges a session's output (DebugAck) each time it consumed this much more: its host
#: agent sends at most monarch_agents.services.debug.WINDOW bytes ahead, so a stopped debugger stops pdb.
_ACK_EVERY = 1 << 20
#: Source files sent to a host that lacks them: only Python files under this client's working
#: directory (a rank must not read arbitrary files of the user's machine), up to this size.
_SOURCE_MAX = 4 << 20


class DebugError(MonarchError):
    """A debug command could not be carried out (one line, no traceback)."""

    exit_code = 1


@dataclass
class DebugSessionInfo:
    """One rank (thread) paused in pdb somewhere in the job."""

    id: int
    rank: int
    host: str
    host_rank: int
    sid: int
    pid: int
    name: str
    actor: str
    command: str
    file: str
    line: int
    function: str
    waiting: bool
    held_by: str
    run_id: str
    kind: str
    coords: dict = field(default_factory=dict)
    started: float = 0.0

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}" if self.file else "?"

    @property
    def key(self) -> tuple[int, int]:
        return (self.host_rank, self.sid)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"where": self.where}


def _from_agent(d: dict, ident: int) -> DebugSessionInfo:
    return DebugSessionInfo(
        id=ident, rank=int(d.get("rank", 0)), host=d.get("host", ""), host_rank=int(d.get("host_rank", 0)),
        sid=int(d["sid"]), pid=int(d.get("pid", 0)), name=d.get("name", ""), actor=d.get("actor", ""),
        command=d.get("command", ""), file=d.get("file", ""), line=int(d.get("line", 0) or 0),
        function=d.get("function", ""), waiting=bool(d.get("waiting")), held_by=d.get("held_by", ""),
        run_id=d.get("run_id", ""), kind=d.get("kind", "breakpoint"), coords=dict(d.get("coords") or {}),
        started=float(d.get("started", 0.0)))


def list_sessions(record: JobRecord) -> list[DebugSessionInfo]:
    """Every debug session in the job, ordered by rank (ids 0, 1, ... in that order)."""
    return DebugClient(record).refresh()


class _Events:
    """A held session's events; taking an ``("out", bytes)`` off counts its bytes as consumed (the
    acknowledgement goes from the reader's thread: output is acknowledged once it was taken, not when
    it arrived, so a debugger that stopped reading holds its host agent to one window)."""

    def __init__(self, consumed: Any):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._consumed = consumed

    def put(self, item: tuple) -> None:
        self._q.put(item)

    def get(self, block: bool = True, timeout: float | None = None) -> tuple:
        item = self._q.get(block, timeout)
        if item[0] == "out":
            self._consumed(len(item[1]))
        return item

    def get_nowait(self) -> tuple:
        return self.get(False)

    def empty(self) -> bool:
        return self._q.empty()


class Attachment:
    """A held session: events arrive on :attr:`events` as ``("out", bytes)``, ``("waiting", None)``
    (pdb waits for a command) and ``("ended", reason)``."""

    def __init__(self, client: "DebugClient", info: DebugSessionInfo, replay: bytes, waiting: bool):
        self.client = client
        self.info = info
        self.replay = replay
        self.waiting = waiting
        self._consumed = 0  # bytes of output taken off events since the attach
        self._acked = 0
        self.events = _Events(self._on_consumed)
        self.ended: str | None = None
        #: Called (on the IO thread) when the session ends: the prompt may be blocked reading a line.
        self.on_end: Any = None
        addr = client.addr_of(info)
        # This session's output comes to a port of its own (several may be held at once: cast).
        self.stream = client.rt.open_stream(self._on_stream, lambda a, err: self._ended(
            f"the host agent on {info.host} is unreachable ({err})"), [addr])

    def _on_stream(self, msg: Any) -> None:
        from monarch_agents import messages as m

        if type(msg) is m.DebugOutput:
            if msg.data:
                self.events.put(("out", msg.data))
            if msg.waiting:
                self.events.put(("waiting", None))
        elif type(msg) is m.DebugEnded:
            self._ended(msg.reason)
        elif type(msg) is m.DebugSourceRequest:
            self.client.send_sources(self.info, msg.files)

    def _on_consumed(self, n: int) -> None:
        from monarch_agents import messages as m

        self._consumed += n
        if self._consumed - self._acked >= _ACK_EVERY and self.ended is None:
            self._acked = self._consumed
            self._send(m.DebugAck(self.info.sid, self.client.rt.addr, self._consumed))

    def _send(self, msg: Any) -> None:
        from monarch_agents.errors import SupervisionError

        try:
            self.client.rt.send(self.client.addr_of(self.info), msg)
        except SupervisionError as e:
            self._ended(f"the host agent on {self.info.host} is unreachable ({e})")

    def send_line(self, line: str) -> None:
        from monarch_agents import messages as m

        self.waiting = False
        self._send(m.DebugInput(self.info.sid, self.client.rt.addr, (line + "\n").encode()))

    def send_eof(self) -> None:
        from monarch_agents import messages as m

        self.waiting = False
        self._send(m.DebugInput(self.info.sid, self.client.rt.addr, b"", True))

    def interrupt(self) -> None:
        from monarch_agents import messages as m

        self._send(m.DebugInterrupt(self.info.sid, self.client.rt.addr))

    def detach(self) -> None:
        from monarch_agents import messages as m

        if self.ended is None:
            self._send(m.DebugDetach(self.info.sid, self.client.rt.addr))
        self.stream.close()

    def complete(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        from monarch_agents import messages as m

        fut = self.client.rt.request(self.client.addr_of(self.info),
                                     lambda port: m.DebugComplete(self.info.sid, text, line, begidx, endidx, port))
        try:
            return list(fut.get(timeout=_COMPLETE_TIMEOUT_S))
        except Exception:
            return []

    def _ended(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
            self.stream.close()
            self.events.put(("ended", reason))
            if self.on_end is not None:
                self.on_end()

    def run_until_waiting(self, line: str | None, timeout: float | None = None) -> tuple[bytes, str | None]:
        """Send ``line`` (if any) and collect output until pdb waits again; returns (output, ended reason)."""
        if line is not None:
            self.send_line(line)
        out = bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                kind, value = self.events.get(timeout=left)
            except queue.Empty:
                return bytes(out), f"no answer within {timeout:.0f} s (still running)"
            if kind == "out":
                out += value
            elif kind == "waiting":
                self.waiting = True
                return bytes(out), None
            else:
                return bytes(out), value


class DebugClient:
    """This process's view of the job's debug sessions, with ids stable for its lifetime."""

    def __init__(self, record: JobRecord):
        self.record = record
        self.rt = record.runtime()
        self.by_rank = {h.host_rank: h for h in record.hosts}
        self.ids: dict[tuple[int, int], int] = {}
        self.sessions: dict[int, DebugSessionInfo] = {}
        self.unreachable: list[str] = []
        self.cwd = os.path.realpath(os.getcwd())

    def addr_of(self, info: DebugSessionInfo) -> str:
        return self.by_rank[info.host_rank].addr

    def refresh(self) -> list[DebugSessionInfo]:
        """Ask every host agent for its sessions; new ones get the next ids, in rank order."""
        from monarch_agents import messages as m
        from monarch_agents.fanout import fan_out

        hosts = list(self.record.hosts)
        # Through the tree of host agents (a pod's agent cannot forward: a Kubernetes reservation, straight).
        call = fan_out(self.rt, [(h.addr, h.host, m.DebugList(m.PortRef("", 0))) for h in hosts],
                       timeout_s=_LIST_TIMEOUT_S, direct=True if self.record.spec.scheduler == "kubernetes" else None)
        call.wait(_LIST_TIMEOUT_S + 1.0)
        found: list[dict] = []
        self.unreachable = []
        for i, h in enumerate(hosts):
            ok, value = call.results.get(i, (False, "gave no answer in time"))
            if ok and isinstance(value, list):
                found += value
            else:
                self.unreachable.append(f"{h.host}: {value if not ok else 'a malformed answer'}")
        found.sort(key=lambda d: (d.get("rank", 0), d.get("host_rank", 0), d.get("started", 0.0), d["sid"]))
        live = {}
        for d in found:
            key = (int(d.get("host_rank", 0)), int(d["sid"]))
            if key not in self.ids:
                self.ids[key] = max(self.ids.values(), default=-1) + 1
            info = _from_agent(d, self.ids[key])
            live[info.id] = info
        self.sessions = live
        return sorted(live.values(), key=lambda i: i.id)

    def find(self, ident: int) -> DebugSessionInfo:
        """The session shown as ``ident`` (refreshed: it may have ended since)."""
        known = any(v == ident for v in self.ids.values())
        self.refresh()
        s = self.sessions.get(ident)
        if s is None:
            if known:
                raise DebugError(f"session {ident} has ended (its rank continued or exited); `list` shows what is left")
            raise DebugError(f"no debug session {ident}; `list` shows the sessions")
        return s

    def find_actor(self, name: str, rank: int) -> DebugSessionInfo:
        self.refresh()
        for s in self.sessions.values():
            if rank == s.rank and name in (s.name, s.actor):
                return s
        raise DebugError(f"no debug session for {name} rank {rank}; `list` shows the sessions")

    def attach(self, info: DebugSessionInfo) -> Attachment:
        """Hold ``info``'s session; raises DebugError when it has ended or another debugger holds it."""
        from monarch_agents import messages as m
        from monarch_agents.services.debug import debugger_identity

        a = Attachment(self, info, b"", False)  # its port is open before asking: output may follow at once
        fut = self.rt.request(self.addr_of(info),
                              lambda port: m.DebugAttach(info.sid, self.rt.addr, debugger_identity(), port, a.stream.ref))
        try:
            r = fut.get(timeout=_ATTACH_TIMEOUT_S)
        except Exception as e:
            a.stream.close()
            text = str(e).strip().splitlines()
            raise DebugError(text[0] if text else f"could not attach to session {info.id}") from None
        a.replay, a.waiting = r["replay"], r["waiting"]
        a.info = _from_agent(r["info"], info.id)
        return a

    def send_sources(self, info: DebugSessionInfo, names: list) -> None:
        """Answer a host that lacks source files with this machine's copies (IO thread)."""
        from monarch_agents import messages as m

        files = {str(name): self.read_source(str(name)) for name in names}
        try:
            self.rt.send(self.addr_of(info), m.DebugSource(info.sid, files))
        except Exception as e:
            # The host went away or the session ended while we read: nobody is left to answer.
            log.debug("sources for debug session %s not sent: %s", info.id, e)

    def read_source(self, name: str) -> str | None:
        """This machine's copy of a source file a rank's host lacks, if it may be shared."""
        path = os.path.realpath(os.path.join(self.cwd, name))
        if not path.endswith(".py") or not (path == self.cwd or path.startswith(self.cwd + os.sep)):
            return None
        try:
            if os.path.getsize(path) > _SOURCE_MAX:
                return None
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None
