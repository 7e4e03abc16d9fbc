"""Every message that crosses a process boundary, one dataclass per kind.

Messages are one-way: each process has one inbound address, and a request that
wants an answer names a :class:`PortRef` (address + port id) to send it to.
User values (endpoint arguments, results) travel as :class:`Pickled` so that they
are encoded once for a whole mesh and decoded by the thread that uses them,
not by the receive loop.

Every ``monarch`` command imports this module, so it is built to import fast:
``@message`` is a dataclass that generates only ``__init__`` (Python generates
each dataclass method by compiling source: ``frozen``, ``repr`` and ``eq`` on two
dozen classes cost ~15 ms per command), with ``__repr__`` and ``__eq__`` from
:class:`Message`.  Treat messages as immutable all the same.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass, field
from typing import Any, TypeVar, dataclass_transform

from monarch_agents import wire

_M = TypeVar("_M")


class Message:
    """The base of every message: a readable repr and field-wise equality, without generated code."""

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__dataclass_fields__)  # type: ignore[attr-defined]
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__dataclass_fields__)  # type: ignore[attr-defined]


@dataclass_transform(eq_default=False, field_specifiers=(field,))
def message(cls: type[_M]) -> type[_M]:
    """Make ``cls`` (a subclass of :class:`Message`) a dataclass with only ``__init__`` generated
    (``dataclass_transform``: type checkers see its fields and ``__init__``)."""
    return dataclass(repr=False, eq=False)(cls)


@message
class Pickled(Message):
    """A user value, pickled once; decode with :meth:`load`."""

    body: Any
    buffers: list[Any] = field(default_factory=list)

    @classmethod
    def of(cls, value: Any) -> "Pickled":
        body, buffers = wire.dumps(value)
        return cls(body, buffers)  # a list of its own already

    def load(self) -> Any:
        return wire.loads(self.body, self.buffers)

    def __reduce__(self) -> Any:
        bufs = [b if isinstance(b, pickle.PickleBuffer) else pickle.PickleBuffer(b) for b in self.buffers]
        return Pickled, (pickle.PickleBuffer(self.body) if len(self.body) >= wire.OOB_THRESHOLD else bytes(self.body), bufs)


class Streamed(Message):
    """A message of a stream (a run's output, a shell's bytes, later debug and sync sessions).

    Each carries the ``port_id`` of the port its stream was opened on
    (:meth:`monarch_agents.runtime.Runtime.open_stream`); the runtime hands it to that port,
    so any number of streams of one kind coexist in one process.
    """

    port_id: int


@dataclass(frozen=True)
class PortRef:  # stays a frozen dataclass: small, and hashable
    """Where to send answers: a process's inbound address and a port in it."""

    addr: str
    port_id: int


@message
class Reply(Message):
    """One answer to a port. ``ok`` False means ``payload`` is an exception."""

    port_id: int
    rank: int
    ok: bool
    payload: Any


# --- proc agent -------------------------------------------------------------


@message
class SpawnActor(Message):
    actor_id: str
    name: str
    payload: Pickled  # (cls, args, kwargs)
    point: dict
    extent: dict
    reply: PortRef
    owner: str
    creator: str = ""  # the spawner's qualified name, for log lines (``<root>.<mod.Cls name>``)


@message
class Call(Message):
    actor_id: str
    method: str
    payload: Pickled  # (args, kwargs)
    point: dict
    extent: dict
    reply: PortRef | None
    rank: int  # the receiver's rank in the slice that was messaged
    sender: str


@message
class StopActor(Message):
    actor_id: str
    reply: PortRef
    rank: int = 0
    #: Why (``ActorMesh.stop(reason)``): the ``Stopped`` status's reason, as Monarch records it.
    reason: str | None = None


@message
class StopProc(Message):
    reply: PortRef | None


# --- host agent -------------------------------------------------------------


@message
class SpawnProcs(Message):
    """Start ``count`` proc agents owned by ``owner``; answer a list of ProcInfo."""

    mesh_id: str
    count: int
    owner: str
    reply: PortRef
    env: dict
    preload: tuple = ()
    point_base: int = 0
    #: How long the procs outlive ``owner`` once it is gone (the owner's ``mesh_orphan_timeout``):
    #: 0 at once, None never (they run until stopped, or until their host agent stops).
    orphan_s: float | None = 0.0
    #: One entry per proc, or None: ``{"env": {name: value or None to unset}, "python": path or
    #: None}``: that proc's variables on top of ``env``, and the interpreter it runs (None: forked
    #: from the warm zygote; a path: that program runs ``-m monarch_agents.proc_exec``).
    per_proc: list | None = None


@message
class ProcInfo(Message):
    addr: str
    pid: int
    host: str
    host_rank: int


@message
class ProcDied(Message):
    """Sent by a host agent to a proc's owner the moment the proc exits."""

    addr: str
    pid: int
    host: str
    reason: str
    exit_code: int | None


@message
class StopProcs(Message):
    mesh_id: str
    reply: PortRef | None
    #: How long each proc has after SIGTERM before SIGKILL (the client's ``mesh_terminate_timeout``);
    #: None: the agent's own default.
    grace_s: float | None = None


@message
class KillProc(Message):
    """Signal one proc agent this host agent started (by pid; any other pid is refused)."""

    pid: int
    signum: int
    reply: PortRef | None

    def __post_init__(self) -> None:
        self.signum = int(self.signum)  # see SignalRun


@message
class Ping(Message):
    reply: PortRef


@message
class HostInfo(Message):
    """A host agent's answer to Ping: who it is, and each service's ``info()`` by service name."""

    host: str
    host_rank: int
    pid: int
    addr: str
    ip: str
    started_at: float
    log_dir: str
    services: dict = field(default_factory=dict)

    @property
    def procs(self) -> list:
        """The proc agents running there (pid, mesh, addr, owner)."""
        return self.services.get("procs", {}).get("procs", [])

    @property
    def runs(self) -> list:
        """The ranks of runs still running there (run_id, rank, pid, argv, started)."""
        return self.services.get("runs", {}).get("runs", [])


@message
class RunCommand(Message):
    """Run ``argv`` on the host; output streams to the port ``reply`` as RunOutput, then one RunExited.

    ``reply.addr`` empty: a detached run, output only in the host's log."""

    run_id: str
    argv: list
    env: dict
    cwd: str | None
    reply: PortRef
    rank: int
    owner: str
    #: Where the rank's end goes instead of a RunExited on ``reply``: a ``Reply`` whose payload is
    #: ``(exit_code, reason, log_error, output bytes sent)`` (a fan-out tree collects the ends; output
    #: still streams to ``reply``).  None: RunExited on ``reply``, as before.
    exit_to: PortRef | None = None


@message
class RunOutput(Streamed):
    port_id: int
    run_id: str
    rank: int
    stream: str  # "stdout" | "stderr"
    data: bytes


@message
class RunExited(Streamed):
    """The end of a run's rank (or of a shell): the last message of its stream."""

    port_id: int
    run_id: str
    rank: int
    exit_code: int
    reason: str
    #: Why the rank's log on its host is incomplete (the disk filled, say); '' when it is whole.
    log_error: str = ""


@message
class RunAck(Message):
    """The client has consumed ``consumed`` bytes of rank ``rank``'s output in all: its host agent sends
    at most ``monarch_agents.services.runs.WINDOW`` bytes more before it waits for the next."""

    run_id: str
    rank: int
    consumed: int


@message
class SignalRun(Message):
    run_id: str
    signum: int

    def __post_init__(self) -> None:
        # A plain int on the wire: Debian's Python 3.11.2 pickles ``signal.SIGTERM`` as the global
        # ``signal.SIGTERM``, which the envelope refuses, so every signal to a run was dropped.
        self.signum = int(self.signum)


@message
class Shutdown(Message):
    reply: PortRef | None


@message
class OwnerGone(Message):
    """The client at ``owner`` is gone (its connection to the agent that forwarded its runs closed):
    reap what it owns here, as if this agent had seen it go."""

    owner: str


@message
class Fanout(Message):
    """Deliver control messages to many host agents through a tree of them (``monarch_agents.fanout``).

    ``items`` are ``(index, addr, host, message)``; the first is for the receiver itself, the rest
    are its subtree, which it cuts into at most ``degree`` subtrees and forwards, one Fanout to the
    first host of each.  Each message's answer (or why there is none) goes up the tree as
    ``Reply(reply.port_id, 0, True, {index: (ok, value)})``, several indices per Reply, until every
    index of the subtree is answered, or ``timeout_s`` (None: no deadline, a run) has passed.
    """

    items: list
    degree: int
    timeout_s: float | None
    reply: PortRef


@message
class OpenShell(Message):
    """Start an interactive shell on a pty: its bytes stream to the port ``reply`` as ShellOutput
    (then one RunExited); keys and window sizes come back as ShellData."""

    shell_id: str
    argv: list
    env: dict
    cwd: str | None
    rows: int
    cols: int
    reply: PortRef
    owner: str


@message
class ShellData(Message):
    """Keys for a shell (and its new window size, when ``rows`` and ``cols`` are set).

    ``hangup``: the client's input ended (EOF): the shell is to end, and what runs in its
    foreground with it (see ``ShellsService.hang_up_on_eof``)."""

    shell_id: str
    data: bytes
    rows: int = 0
    cols: int = 0
    hangup: bool = False


@message
class ShellOutput(Streamed):
    port_id: int
    shell_id: str
    data: bytes


@message
class ProcReady(Message):
    """A new proc agent telling its host agent where it listens."""

    token: str
    addr: str
    pid: int


@message
class ReadLog(Message):
    """Ask a host agent for bytes of a run's log, from ``offset``; answers (data, size, done)."""

    run_id: str
    stream: str
    offset: int
    reply: PortRef


@message
class ActorFailed(Message):
    """An actor failed (its supervision was not handled); sent to the actor's owner."""

    addr: str
    actor_id: str
    rank: int
    host: str
    reason: str


@message
class ProcStopping(Message):
    """A proc telling the owners of its actors that it is being stopped (not failing)."""

    addr: str


# --- telemetry (see monarch_telemetry and monarch_agents/services/telemetry.py) -------------------------


@message
class TelemetryRows(Message):
    """Rows a proc or client recorded, for its host agent's tables: {table: (rows, columns)}."""

    rows: dict


@message
class TelemetryRetain(Message):
    """Keep rows of the host's message, span and metric tables only this long (Monarch's
    ``TelemetryConfig.retention_secs``; 0: as long as their bounds allow)."""

    max_age_s: float


@message
class TelemetryScan(Message):
    """Run pushed-down scans over the host's tables; answers {table: Arrow IPC bytes or an error}."""

    scans: dict
    timeout_s: float
    reply: PortRef


@message
class TelemetryQuery(Message):
    """Run ``sql`` over the telemetry of ``hosts`` (``[addr, host]`` each, this one among them) here:
    plan, scans through the tree of host agents, the finishing query on this agent's warm engine.
    ``extra``: {table: [row dicts]} the asker adds (its actor programs' ``run_ranks`` and ``logs``).
    Answers ``{"columns", "rows" (lists of plain values), "limited", "missing", "errors"}``, or an
    error whose message is the query's."""

    sql: str
    row_limit: int | None
    timeout_s: float
    hosts: list
    extra: dict
    reply: PortRef


@message
class TakeStacks(Message):
    """py-spy stacks of live procs and ranks (``ranks``: only those run ranks; ``pids``: only those
    procs); answers Arrow IPC bytes.  A ``dump_id`` marks the rows kept (the mesh admin's stored dumps)."""

    ranks: list | None
    reply: PortRef
    pids: list | None = None
    dump_id: str | None = None


@message
class ProfileProc(Message):
    """Sample one live proc of this host with ``py-spy record`` for ``duration_s``; answers
    ``{"svg": bytes}``, or ``{"error": kind, "message": text}`` (kind: not_found, unavailable,
    timeout, failed)."""

    pid: int
    duration_s: int
    rate_hz: int
    native: bool
    threads: bool
    nonblocking: bool
    reply: PortRef


@message
class ConfigDump(Message):
    """Ask a proc for its configuration: answers ``{"env": {name: value}, "runtime": {key: value}}``,
    the environment variables of ``names`` it has and what it set itself (``monarch.config.configure``)."""

    names: list
    reply: PortRef


# --- debug sessions (``monarch debug``; monarch_agents/services/debug.py) ---------------


@message
class DebugList(Message):
    """Ask a host agent for its debug sessions; answers a list of dicts (see DebugService.sessions_info)."""

    reply: PortRef


@message
class DebugAttach(Message):
    """Hold session ``sid``: its output streams to ``stream`` (DebugOutput, DebugSourceRequest, and
    DebugEnded last); answers the replay."""

    sid: int
    client: str  # the attaching process's address
    who: str  # shown to a second debugger: "user@host pid N"
    reply: PortRef
    stream: PortRef


@message
class DebugInput(Message):
    """One command line for the session's pdb; ``eof`` is Ctrl-D."""

    sid: int
    client: str
    data: bytes
    eof: bool = False


@message
class DebugInterrupt(Message):
    """Ctrl-C: interrupt the command the session's pdb is running."""

    sid: int
    client: str


@message
class DebugDetach(Message):
    sid: int
    client: str


@message
class DebugAck(Message):
    """The holder ``client`` has consumed ``consumed`` bytes of session ``sid``'s DebugOutput since it
    attached: the host agent sends at most ``monarch_agents.services.debug.WINDOW`` bytes more before it
    stops reading the rank (whose pdb then blocks on its write, as on a terminal)."""

    sid: int
    client: str
    consumed: int


@message
class DebugOutput(Streamed):
    """Output of a held session; ``waiting`` is True when pdb now waits for a command."""

    port_id: int
    sid: int
    host_rank: int
    data: bytes
    waiting: bool = False


@message
class DebugEnded(Streamed):
    """A held session is over (the rank continued, quit or exited): the last message of its stream."""

    port_id: int
    sid: int
    host_rank: int
    reason: str


@message
class DebugSourceRequest(Streamed):
    """The session's host lacks these source files; the holder answers with DebugSource."""

    port_id: int
    sid: int
    host_rank: int
    files: list


@message
class DebugSource(Message):
    sid: int
    files: dict  # name -> text, or None when the client has no such file either


@message
class DebugComplete(Message):
    """Tab completion at the session's pdb prompt; answers a list of matches."""

    sid: int
    text: str
    line: str
    begidx: int
    endidx: int
    reply: PortRef


@message
class DebugWaiting(Streamed):
    """On a run's stream, when one of its ranks opens a debug session."""

    port_id: int
    run_id: str
    session: dict


@message
class ActorDebugWaiting(Message):
    """To the owner of a proc, when one of its actors opens a debug session."""

    session: dict


# --- compact forms of the hot path (see wire.register_compact) -------------------------------


def _pickled_values(p: Pickled) -> tuple[Any, list]:
    """A Pickled's body and buffers as plain values: big ones out of band, as ``Pickled.__reduce__`` sends them."""
    body = p.body
    if len(body) >= wire.OOB_THRESHOLD:
        body = pickle.PickleBuffer(body)
    bufs = p.buffers
    if bufs:
        bufs = [b if type(b) is pickle.PickleBuffer else pickle.PickleBuffer(b) for b in bufs]
    return body, bufs


def _call_values(c: Call) -> tuple | None:
    if type(c.payload) is not Pickled:
        return None
    body, bufs = _pickled_values(c.payload)
    r = c.reply
    return (c.actor_id, c.method, body, bufs, c.point, c.extent, r.addr if r is not None else None,
            r.port_id if r is not None else 0, c.rank, c.sender)


def _call_from(v: tuple) -> Call:
    actor_id, method, body, bufs, point, extent, reply_addr, reply_port, rank, sender = v
    reply = PortRef(reply_addr, reply_port) if reply_addr is not None else None
    return Call(actor_id, method, Pickled(body, bufs), point, extent, reply, rank, sender)


def _reply_values(r: Reply) -> tuple | None:
    if type(r.payload) is not Pickled:
        return None  # an agent's answer (True, a list of ProcInfo, an error): the usual pickle
    body, bufs = _pickled_values(r.payload)
    return r.port_id, r.rank, r.ok, body, bufs


def _reply_from(v: tuple) -> Reply:
    port_id, rank, ok, body, bufs = v
    return Reply(port_id, rank, ok, Pickled(body, bufs))


wire.register_compact(Call, _call_values, _call_from)
wire.register_compact(Reply, _reply_values, _reply_from)


#: A raw answer: port id, rank, ok, then the Pickled's body (an answer without buffers: most).
_REPLY_RAW = struct.Struct("!QqB")


def _reply_raw(r: Reply) -> bytes | None:
    p = r.payload
    if type(p) is not Pickled or p.buffers or type(p.body) is not bytes or len(p.body) >= wire.OOB_THRESHOLD:
        return None
    if not 0 <= r.port_id < 1 << 64 or type(r.rank) is not int:
        return None
    return _REPLY_RAW.pack(r.port_id, r.rank, bool(r.ok)) + p.body


def _reply_from_raw(data: Any) -> Reply:
    port_id, rank, ok = _REPLY_RAW.unpack_from(data)
    if ok > 1:
        raise ValueError("a malformed answer")
    return Reply(port_id, rank, ok == 1, Pickled(bytes(data[_REPLY_RAW.size:]), []))  # ok: 0 or 1 (checked)


wire.register_raw(Reply, _reply_raw, _reply_from_raw)


# A raw call: what a caller repeats (actor, method, point, extent, where answers go, sender) as one
# pickle of plain values, which the receiver decodes once and then knows by its bytes; then the
# answer port, the rank, and the arguments' Pickled body (a call without buffers: most).  Decoding
# a call was ~29k instructions, ~2/3 of them the unpickler made per message and the values it
# rebuilt; a known prefix costs a dict lookup.
#   !I n | n bytes: pickle of (actor_id, method, point, extent, reply_addr, sender) | !Qq port, rank | body
_CALL_HEAD = struct.Struct("!I")
_CALL_VAR = struct.Struct("!Qq")
#: The prefixes of the calls this process sends, by what they hold -> (_CALL_HEAD + pickle).
_call_prefixes: dict[tuple, bytes] = {}
#: The prefixes of the calls this process received -> their values, checked (bounded: a peer may
#: send any number of distinct ones; the cache is cleared when full, never grown past it).
_call_statics: dict[bytes, tuple] = {}
_CALL_CACHE_MAX = 1024


def _call_raw(c: Call) -> bytes | None:
    p = c.payload
    r = c.reply
    if (type(p) is not Pickled or p.buffers or type(p.body) is not bytes or len(p.body) >= wire.OOB_THRESHOLD
            or r is None or type(c.rank) is not int or not 0 <= r.port_id < 1 << 64):
        return None
    point, extent = c.point, c.extent
    if type(point) is not dict or type(extent) is not dict:
        return None
    key = (c.actor_id, c.method, r.addr, c.sender, *point.items(), None, *extent.items())
    try:
        prefix = _call_prefixes.get(key)
    except TypeError:  # an unhashable value in a point (never ours): the compact form takes it
        return None
    if prefix is None:
        static = pickle.dumps((c.actor_id, c.method, point, extent, r.addr, c.sender), protocol=5)
        if len(_call_prefixes) >= _CALL_CACHE_MAX:
            _call_prefixes.clear()
        prefix = _call_prefixes[key] = _CALL_HEAD.pack(len(static)) + static
    return prefix + _CALL_VAR.pack(r.port_id, c.rank) + p.body


def _call_from_raw(data: Any) -> Call:
    (n,) = _CALL_HEAD.unpack_from(data)
    at = _CALL_HEAD.size + n
    static = bytes(data[_CALL_HEAD.size:at])
    values = _call_statics.get(static)
    if values is None:
        if len(static) != n:
            raise ValueError("a truncated call")
        values = _static_call_values(static)
        if len(_call_statics) >= _CALL_CACHE_MAX:
            _call_statics.clear()
        _call_statics[static] = values
    actor_id, method, point, extent, reply_addr, sender = values
    port_id, rank = _CALL_VAR.unpack_from(data, at)
    # Each call gets dicts of its own: the actor's context hands them to user code.
    return Call(actor_id, method, Pickled(bytes(data[at + _CALL_VAR.size:]), []), dict(point), dict(extent),
                PortRef(reply_addr, port_id), rank, sender)


def _static_call_values(static: bytes) -> tuple:
    """A raw call's prefix, read by the unpickler that refuses every global, and checked."""
    values = wire.loads_plain(static)
    if type(values) is not tuple or len(values) != 6:
        raise ValueError("a malformed call")
    actor_id, method, point, extent, reply_addr, sender = values
    if not (type(actor_id) is str and type(method) is str and type(point) is dict and type(extent) is dict
            and type(reply_addr) is str and type(sender) is str):
        raise ValueError("a malformed call")
    return values


wire.register_raw(Call, _call_raw, _call_from_raw)
