"""Compatibility only: Monarch's ``monarch._src.actor.waker`` in plain Python.

An ``Event`` is set by its waker from any thread and awaited on one event loop (the first that
awaits it); once set it stays set until cleared.  ``PyTestWaker.create()`` gives a waker and its
event, as Monarch's does for tests of code that waits on one.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Literal


class Event:
    """An event set by a waker (from any thread) and awaited on one event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._is_set = False  # woken before any wait
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    async def wait(self) -> Literal[True]:
        """Wait until the event is set; it stays set until cleared.  The first loop that awaits it
        owns it: awaiting it on another loop raises ``RuntimeError``."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._loop is None:
                self._loop, self._event = loop, asyncio.Event()
                if self._is_set:
                    self._event.set()
            elif self._loop is not loop:
                raise RuntimeError(f"Event already associated with event loop {self._loop}")
            event = self._event
        assert event is not None
        return await event.wait()

    def clear(self) -> None:
        """Clear the event (on its loop's thread).  As in Monarch, a wake is delivered to the loop
        in its turn: one not yet delivered sets the event after this (a waiter re-checks what it
        waits for, as ``Receiver.recv`` does)."""
        with self._lock:
            if self._event is not None:
                self._event.clear()

    def _wake(self) -> None:
        with self._lock:
            loop, event = self._loop, self._event
            if loop is None:
                self._is_set = True  # the first wait() takes it
                return
        assert event is not None
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:
            pass  # its loop is closed: nobody can be waiting


class PyTestWaker:
    """The waking side of an :class:`Event`, for tests (``create()`` makes a pair)."""

    def __init__(self, event: Event) -> None:
        self._event = weakref.ref(event)

    def wake(self) -> bool:
        """Set the event; False once the event is gone (nobody can wait on it any more)."""
        event = self._event()
        if event is None:
            return False
        event._wake()
        return True

    @staticmethod
    def create() -> tuple["PyTestWaker", Event]:
        event = Event()
        return PyTestWaker(event), event
