"""Ports and channels: send values to a receiver in another process.

``Channel.open()`` gives a ``(Port, PortReceiver)`` pair.  The port is a small
picklable address that can be passed to any actor; ``port.send(v)`` delivers
``v`` to the receiver, ``receiver.recv()`` returns a ``Future`` for the next one.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Generic, TypeVar

from monarch_agents.errors import SupervisionError
from monarch_agents.future import Future
from monarch_agents.messages import Pickled, PortRef, Reply

R = TypeVar("R")


def _runtime():
    from monarch_agents.runtime import ensure

    return ensure()


#: Hands a value that a :class:`Port` has no route for back to the actor that sent it (Monarch's
#: undeliverable message): ``returned(sender, port, ok, value, error)``, installed by
#: ``monarch.actor._mailbox`` (this layer cannot import that one).  None: the send raises.
returned: Callable[[Any, "Port[Any]", bool, Any, BaseException], None] | None = None

#: Whether ``addr`` may be sent to at all (an address of this job's transport); set with ``returned``.
routable: Callable[[str], bool] = lambda addr: True


class Port(Generic[R]):
    """Where to send values; picklable, so it can travel to other actors.

    ``Port(ref)`` or ``Port(ref, rank)``; or Monarch's ``Port(port_ref, instance, rank)``, whose
    ``port_ref`` may be Monarch's hand-built ``PortRef(PortId(...))`` and whose ``instance``
    (``context().actor_instance._as_rust()``) is the sender: a value that cannot be delivered goes
    back to that actor (its ``_handle_undeliverable_message``), as in Monarch.  A port is never
    pickled with its sender: as Monarch's, it is rebuilt with the actor that unpickles it, so the
    actor that uses a port it was given hears of what that port could not deliver.
    """

    def __init__(self, ref: Any, *args: Any):
        if len(args) > 2:
            raise TypeError(f"Port() takes a port ref, then a rank or an instance and a rank ({len(args) + 1} given)")
        instance, rank = (args[0], args[1]) if len(args) == 2 else (None, args[0] if args else 0)
        self._port_ref = ref  # as it was given (Monarch's ``Port._port_ref``)
        if not isinstance(ref, PortRef):
            # Monarch's ``PortRef(PortId(actor_id=ActorAddr(addr=...), port=...))``
            pid = ref.port_id
            ref = PortRef(pid.actor_id.addr, pid.port)
        self._ref = ref
        self._rank = 0 if rank is None else rank
        self._instance = instance

    def send(self, value: R) -> None:
        """Deliver ``value`` to the receiver (fire and forget)."""
        self._post(True, value)

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's next ``recv()`` raise ``exc``."""
        self._post(False, exc)

    #: Whether no process of this job can have this port's address (asked once, on the first send).
    _unroutable: bool | None = None

    def _post(self, ok: bool, value: Any) -> None:
        addr = self._ref.addr
        unroutable = self._unroutable
        if unroutable is None and returned is not None:
            unroutable = self._unroutable = not routable(addr)
        if unroutable:
            # No process of this job has that address: as in Monarch, the value goes back to the
            # actor sending it (a client, which has no handler for it, raises below).
            sender = self._instance if self._instance is not None else _current_actor()
            if sender is not None:
                returned(sender, self, ok, value,
                         LookupError(f"no route to {addr!r}: not an address of this job's transport"))
                return
        _runtime().send(addr, Reply(self._ref.port_id, self._rank, ok, Pickled.of(value)))

    def __reduce__(self) -> Any:
        from monarch_agents.runtime import port_for_peer

        return _reconstruct_port, (port_for_peer(self._ref), self._rank)

    def __repr__(self) -> str:
        return f"Port({self._ref.addr}#{self._ref.port_id})"


def _current_actor() -> Any:
    """The actor running here (its ``ActorSlotInfo``), None in a client."""
    from monarch_agents.context import current

    return current().actor


def _reconstruct_port(ref: PortRef, rank: int) -> "Port[Any]":
    # Bound to the actor that unpickles it, never to the one that pickled it (as Monarch's); where no
    # actor is running (a client, or a thread of the runtime), the sender is whoever sends.
    return Port(ref, _current_actor(), rank)


class _Queue:
    """A port handler that queues values for ``recv()``."""

    def __init__(self) -> None:
        self.port_id = 0
        self.values: collections.deque = collections.deque()
        self.waiters: collections.deque[Future] = collections.deque()
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    def _push(self, ok: bool, payload: Any, rank: int) -> None:
        with self.lock:
            if self.waiters:
                fut, ranked = self.waiters.popleft()
            else:
                self.values.append((ok, payload, rank))
                return
        _resolve(fut, ok, payload, rank if ranked else None)

    def deliver(self, reply: Reply) -> None:
        self._push(reply.ok, reply.payload, reply.rank)

    def lost(self, addr: str, error: SupervisionError) -> None:
        pass  # a port can have many senders; one dying does not end it

    def next(self, ranked: bool = False) -> Future:
        fut: Future = Future()
        with self.lock:
            if not self.values:
                self.waiters.append((fut, ranked))
                return fut
            ok, payload, rank = self.values.popleft()
        _resolve(fut, ok, payload, rank if ranked else None)
        return fut


def _resolve(fut: Future, ok: bool, payload: Any, rank: int | None = None) -> None:
    try:
        value = payload.load() if isinstance(payload, Pickled) else payload
    except Exception as e:
        fut.set_exception(e)
        return
    if ok:
        fut.set_result(value if rank is None else (rank, value))
    else:
        fut.set_exception(value if isinstance(value, BaseException) else RuntimeError(str(value)))


class PortReceiver(Generic[R]):
    """The receiving end of a channel."""

    def __init__(self, queue: _Queue):
        self._queue = queue

    def recv(self) -> Future[R]:
        """A future for the next value sent to the port."""
        return self._queue.next()

    def ranked(self) -> "RankedPortReceiver[R]":
        return RankedPortReceiver(self._queue)


class RankedPortReceiver(PortReceiver):
    """A receiver whose values come as ``(rank, value)``: the rank of the sender's port."""

    def recv(self) -> Future:
        return self._queue.next(ranked=True)


class Channel(Generic[R]):
    """Factory for port / receiver pairs."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        q = _Queue()
        ref = _runtime().open_port(q)
        return Port(ref), PortReceiver(q)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], RankedPortReceiver[R]]:
        """Like :meth:`open`, but ``recv()`` gives ``(rank, value)``: the rank of the port that sent it
        (a port an actor gets as its explicit response port has the actor's rank)."""
        port, recv = Channel.open(once)
        return port, recv.ranked()
