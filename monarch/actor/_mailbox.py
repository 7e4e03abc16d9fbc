"""Plain-Python versions of the mailbox objects Monarch's programs build by hand (compatibility).

Monarch's ``PortId``/``PortRef`` (``monarch_hyperactor.mailbox``), ``ActorAddr``
(``monarch_hyperactor.proc``) and ``PythonMessage``/``PythonMessageKind`` (``monarch_hyperactor.actor``)
are objects of its Rust runtime (its ``Buffer`` is ``monarch._src.actor.pickle``'s).  Here a ``PortRef``
names a port of this job's transport (``tcp://host:port#id`` and a port number) and ``send`` hands
the message to the runtime, as ``Port.send`` does.  A message that cannot be delivered comes back
to the sending actor as an :class:`UndeliverableMessageEnvelope`: its
``_handle_undeliverable_message`` sees it after the current message, and unless that returns True
the actor fails (its owner's ``__supervise__`` or the client's ``unhandled_fault_hook`` hears of it),
as in Monarch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from monarch_agents import names as _names
from monarch_agents import ports as _ports
from monarch_agents.names import location as _location

# An address of this job's transport: what a process listens on, then "#" and its incarnation.
_TRANSPORT_ADDR = re.compile(r"^(tcp|ipc)://[^#\s]+#\S+$")


def _address(location: str) -> str:
    """The inverse of :func:`monarch_agents.names.location`: an address of ours (it has a ``#``) stays as it is."""
    if "#" in location:
        return location
    scheme, sep, rest = location.partition("://")
    if not sep:
        return location
    return f"local:{rest}" if scheme == "inproc" else f"{scheme}:{rest}"


@dataclass(frozen=True)
class ActorAddr:
    """Where an actor lives: its process's address, its proc's name and its own.

    As Monarch's (a singleton root actor of a named proc): ``str()`` is ``actor.proc@location``,
    which :meth:`from_string` reads back; ``uid``, ``pid`` and ``label`` are the actor's name,
    ``proc_label`` the proc's, ``proc_id`` is ``proc@location``.
    """

    addr: str
    proc_name: str
    actor_name: str

    @property
    def label(self) -> str:
        return self.actor_name

    @property
    def uid(self) -> str:
        return self.actor_name

    @property
    def pid(self) -> str:
        return self.uid

    @property
    def proc_label(self) -> str:
        return self.proc_name

    @property
    def proc_id(self) -> str:
        return f"{self.proc_name}@{_location(self.addr)}"

    @property
    def is_root(self) -> bool:
        return True

    @staticmethod
    def from_string(text: str) -> "ActorAddr":
        """The address ``str()`` printed (``actor.proc@location``)."""
        names, at, location = text.partition("@")
        actor, dot, proc = names.partition(".")
        if not (at and dot and actor and proc and location):
            raise ValueError(f"Failed to extract actor id from {text}: expected actor.proc@location")
        return ActorAddr(_address(location), proc, actor)

    def __str__(self) -> str:
        return _names.actor_addr(self.addr, self.proc_name, self.actor_name)


@dataclass(frozen=True)
class PortId:
    """One port of one actor; ``str()`` is Monarch's ``actor.proc:port@location``."""

    actor_id: ActorAddr
    port: int

    @property
    def index(self) -> int:
        return self.port

    @staticmethod
    def from_string(text: str) -> "PortId":
        """The port id ``str()`` printed (``actor.proc:port@location``)."""
        names, at, location = text.partition("@")
        actor_proc, colon, port = names.rpartition(":")
        if not (at and colon and port.isdigit()):
            raise ValueError(f"Failed to extract port id from {text}: expected actor.proc:port@location")
        return PortId(ActorAddr.from_string(f"{actor_proc}@{location}"), int(port))

    def __str__(self) -> str:
        a = self.actor_id
        return f"{a.actor_name}.{a.proc_name}:{self.port}@{_location(a.addr)}"


class _ResultKind:
    def __init__(self, rank: int | None) -> None:
        self.rank = rank

    def __repr__(self) -> str:
        return f"PythonMessageKind.Result(rank={self.rank})"


class _ExceptionKind(_ResultKind):
    def __repr__(self) -> str:
        return f"PythonMessageKind.Exception(rank={self.rank})"


class PythonMessageKind:
    """The kinds of message a port takes: an answer (``Result``) or a failure (``Exception``)."""

    Result = _ResultKind
    Exception = _ExceptionKind


@dataclass
class PythonMessage:
    """A message for a port: its kind, its pickled bytes and the values kept out of them."""

    kind: Any
    message: bytes
    pending_pickle_state: Any = None

    def __init__(self, kind: Any, message: Any, pending_pickle_state: Any = None) -> None:
        self.kind = kind
        self.message = bytes(message)
        self.pending_pickle_state = pending_pickle_state


@dataclass(frozen=True)
class UndeliverableMessageEnvelope:
    """A message that came back: who sent it, where to, and why it was not delivered."""

    _sender: str
    _dest: PortId
    _error: str

    def sender(self) -> str:
        return self._sender

    def dest(self) -> PortId:
        return self._dest

    def error_msg(self) -> str:
        return self._error

    def __str__(self) -> str:
        return f"undeliverable message from {self._sender} to {self._dest}: {self._error}"


class PortRef:
    """A reference to a port; ``send`` delivers a :class:`PythonMessage` to it."""

    def __init__(self, port_id: PortId) -> None:
        self.port_id = port_id

    def __repr__(self) -> str:
        return f"PortRef({self.port_id})"

    def send(self, instance: Any, message: PythonMessage) -> None:
        """Send ``message`` from ``instance`` (``context().actor_instance._as_rust()``); what cannot
        be delivered comes back to that actor (``_handle_undeliverable_message``)."""
        from monarch_agents import messages as m
        from monarch_agents import runtime

        addr = self.port_id.actor_id.addr
        ok = not isinstance(message.kind, _ExceptionKind)
        try:
            if not _routable(addr):
                raise LookupError(f"no route to {addr!r}: not an address of this job's transport")
            rt = runtime.current()
            if rt is None:
                raise RuntimeError("no monarch runtime in this process")
            rank = message.kind.rank or 0
            rt.send(addr, m.Reply(self.port_id.port, rank, ok, m.Pickled(message.message, [])))
        except Exception as e:
            if getattr(instance, "_undeliverable", None) is None:
                raise
            _return(instance, self.port_id, e)


def _routable(addr: str) -> bool:
    return bool(_TRANSPORT_ADDR.match(addr))


def _return(instance: Any, dest: PortId, error: BaseException) -> None:
    """Hand ``instance`` (the sending actor) the envelope of a message it could not deliver; its
    sender is the actor's id, as Monarch's ``message.sender()`` is (a client raises it)."""
    envelope = UndeliverableMessageEnvelope(str(instance.actor_id), dest, f"{type(error).__name__}: {error}")
    instance._undeliverable(envelope)


def _port_returned(sender: Any, port: Any, ok: bool, value: Any, error: BaseException) -> None:
    """What a ``monarch.actor.Port`` had no route for (``monarch_agents.ports.returned``): back to its
    sender, an ``ActorInstance`` given to ``Port(port_ref, instance, rank)`` or the actor using it."""
    from monarch.actor._mesh import ActorInstance

    instance = sender if hasattr(sender, "_undeliverable") else ActorInstance(sender)
    given = port._port_ref
    dest = given.port_id if isinstance(given, PortRef) else \
        PortId(ActorAddr(port._ref.addr, "", ""), port._ref.port_id)
    _return(instance, dest, error)


def _port_routable(addr: str) -> bool:
    # "" is a port that takes nothing (a reply nobody waits for): sending to it stays a no-op.
    return not addr or _routable(addr)


_ports.returned = _port_returned
_ports.routable = _port_routable


__all__ = ["ActorAddr", "PortId", "PortRef", "PythonMessage", "PythonMessageKind",
           "UndeliverableMessageEnvelope"]
