"""Compatibility only: Monarch's ``monarch._src.actor.mpsc`` in plain Python: a channel of many
senders (any thread) and one receiver, read with ``try_recv()`` or awaited with ``recv()``, whose
waiting is an :class:`~monarch._src.actor.waker.Event`.  ``channel_for_test()`` (Monarch's
``pympsc``) makes one.  monarch's channels between actors are ``monarch.actor.Channel``."""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

from monarch._src.actor.waker import Event, PyTestWaker



class _Queue:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: collections.deque = collections.deque()
        self.closed = False
        self.waker, self.event = PyTestWaker.create()

    def put(self, value: Any) -> None:
        with self.lock:
            self.items.append(value)
        self.waker.wake()

    def close(self) -> None:
        with self.lock:
            self.closed = True
        self.waker.wake()


class Receiver:
    """The receiving end of a channel.  ``Receiver[T]`` is the class itself, as Monarch's (a Rust
    class) is."""

    def __class_getitem__(cls, item: Any) -> type:
        return cls

    def __init__(self, queue: _Queue) -> None:
        self._queue = queue

    def try_recv(self) -> Any:
        """The next message, or None if there is none yet; ``EOFError`` once every sender is gone
        and nothing is left."""
        q = self._queue
        with q.lock:
            if q.items:
                return q.items.popleft()
            if q.closed:
                raise EOFError("channel closed")
        return None

    async def recv(self) -> Any:
        """Wait (without blocking the event loop) for the next message; ``EOFError`` once every
        sender is gone and nothing is left."""
        event = self._event()
        while True:
            item = self.try_recv()
            if item is not None:
                return item
            await event.wait()
            event.clear()

    def _event(self) -> Event:
        """Set when a message arrives or the last sender goes."""
        return self._queue.event


class PyTestSender:
    """The sending end of a channel made by :func:`channel_for_test` (any thread may send);
    ``PyTestSender[T]`` is the class itself."""

    def __class_getitem__(cls, item: Any) -> type:
        return cls

    def __init__(self, queue: _Queue) -> None:
        self._queue = queue
        weakref.finalize(self, queue.close)

    def send(self, value: Any) -> None:
        self._queue.put(value)


def channel_for_test() -> tuple[PyTestSender[Any], Receiver[Any]]:
    """A sender and its receiver."""
    q = _Queue()
    return PyTestSender(q), Receiver(q)
