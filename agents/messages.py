"""Every message that crosses a process boundary, one dataclass per kind.

Messages are one-way: each process has one inbound address, and a request that
wants an answer names a :class:`PortRef` (address + port id) to send it to.
User values (endpoint arguments, results) travel as :class:`Pickled` so that they
are encoded once for a whole mesh and decoded by the thread that uses them,
not by the receive loop.

No ``slots=True`` on these dataclasses: it builds each class twice, and the ~10 ms
that costs at import is paid by every ``monarch`` command.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from agents import wire


@dataclass
class Pickled:
    """A user value, pickled once; decode with :meth:`load`."""

    body: Any
    buffers: list[Any] = field(default_factory=list)

    @classmethod
    def of(cls, value: Any) -> "Pickled":
        body, buffers = wire.dumps(value)
        return cls(body, list(buffers))

    def load(self) -> Any:
        return wire.loads(self.body, self.buffers)

    def __reduce__(self) -> Any:
        bufs = [b if isinstance(b, pickle.PickleBuffer) else pickle.PickleBuffer(b) for b in self.buffers]
        return Pickled, (pickle.PickleBuffer(self.body) if len(self.body) >= wire.OOB_THRESHOLD else bytes(self.body), bufs)


@dataclass(frozen=True)
class PortRef:
    """Where to send answers: a process's inbound address and a port in it."""

    addr: str
    port_id: int


@dataclass(frozen=True)
class Reply:
    """One answer to a port. ``ok`` False means ``payload`` is an exception."""

    port_id: int
    rank: int
    ok: bool
    payload: Any


# --- proc agent -------------------------------------------------------------


@dataclass(frozen=True)
class SpawnActor:
    actor_id: str
    name: str
    payload: Pickled  # (cls, args, kwargs)
    point: dict
    extent: dict
    reply: PortRef
    owner: str


@dataclass(frozen=True)
class Call:
    actor_id: str
    method: str
    payload: Pickled  # (args, kwargs)
    point: dict
    extent: dict
    reply: PortRef | None
    rank: int  # the receiver's rank in the slice that was messaged
    sender: str


@dataclass(frozen=True)
class StopActor:
    actor_id: str
    reply: PortRef
    rank: int = 0


@dataclass(frozen=True)
class StopProc:
    reply: PortRef | None


# --- host agent -------------------------------------------------------------


@dataclass(frozen=True)
class SpawnProcs:
    """Start ``count`` proc agents owned by ``owner``; answer a list of ProcInfo."""

    mesh_id: str
    count: int
    owner: str
    reply: PortRef
    env: dict
    preload: tuple = ()
    point_base: int = 0


@dataclass(frozen=True)
class ProcInfo:
    addr: str
    pid: int
    host: str
    host_rank: int


@dataclass(frozen=True)
class ProcDied:
    """Sent by a host agent to a proc's owner the moment the proc exits."""

    addr: str
    pid: int
    host: str
    reason: str
    exit_code: int | None


@dataclass(frozen=True)
class StopProcs:
    mesh_id: str
    reply: PortRef | None


@dataclass(frozen=True)
class Ping:
    reply: PortRef


@dataclass(frozen=True)
class HostInfo:
    host: str
    host_rank: int
    pid: int
    addr: str
    ip: str
    procs: list
    runs: list
    started_at: float
    log_dir: str


@dataclass(frozen=True)
class RunCommand:
    """Run ``argv`` on the host; output streams to ``reply`` as RunOutput/RunExited."""

    run_id: str
    argv: list
    env: dict
    cwd: str | None
    reply: PortRef
    rank: int
    owner: str


@dataclass(frozen=True)
class RunOutput:
    run_id: str
    rank: int
    stream: str  # "stdout" | "stderr"
    data: bytes


@dataclass(frozen=True)
class RunExited:
    run_id: str
    rank: int
    exit_code: int
    reason: str


@dataclass(frozen=True)
class SignalRun:
    run_id: str
    signum: int


@dataclass(frozen=True)
class Shutdown:
    reply: PortRef | None


@dataclass(frozen=True)
class OpenShell:
    """Start an interactive shell on a pty; bytes flow as ShellData both ways."""

    shell_id: str
    argv: list
    env: dict
    cwd: str | None
    rows: int
    cols: int
    reply: PortRef
    owner: str


@dataclass(frozen=True)
class ShellData:
    shell_id: str
    data: bytes
    rows: int = 0
    cols: int = 0


@dataclass(frozen=True)
class ProcReady:
    """A new proc agent telling its host agent where it listens."""

    token: str
    addr: str
    pid: int


@dataclass(frozen=True)
class ReadLog:
    """Ask a host agent for bytes of a run's log, from ``offset``; answers (data, size, done)."""

    run_id: str
    stream: str
    offset: int
    reply: PortRef


@dataclass(frozen=True)
class ActorFailed:
    """An actor failed (its supervision was not handled); sent to the actor's owner."""

    addr: str
    actor_id: str
    rank: int
    host: str
    reason: str
