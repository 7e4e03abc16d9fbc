"""Ports and channels: send values to a receiver in another process.

``Channel.open()`` gives a ``(Port, PortReceiver)`` pair.  The port is a small
picklable address that can be passed to any actor; ``port.send(v)`` delivers
``v`` to the receiver, ``receiver.recv()`` returns a ``Future`` for the next one.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Generic, TypeVar

from monarch_agents.errors import SupervisionError
from monarch_agents.future import Future
from monarch_agents.messages import Pickled, PortRef, Reply

R = TypeVar("R")


def _runtime():
    from monarch_agents.runtime import ensure

    return ensure()


class Port(Generic[R]):
    """Where to send values; picklable, so it can travel to other actors."""

    def __init__(self, ref: PortRef, rank: int = 0):
        self._ref = ref
        self._rank = rank

    def send(self, value: R) -> None:
        """Deliver ``value`` to the receiver (fire and forget)."""
        _runtime().send(self._ref.addr, Reply(self._ref.port_id, self._rank, True, Pickled.of(value)))

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's next ``recv()`` raise ``exc``."""
        _runtime().send(self._ref.addr, Reply(self._ref.port_id, self._rank, False, Pickled.of(exc)))

    def __reduce__(self) -> Any:
        from monarch_agents.runtime import port_for_peer

        return Port, (port_for_peer(self._ref), self._rank)

    def __repr__(self) -> str:
        return f"Port({self._ref.addr}#{self._ref.port_id})"


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
