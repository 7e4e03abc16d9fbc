"""Monarch's ``pytokio`` task objects (``monarch._rust_bindings.monarch_hyperactor.pytokio``
re-exports them), which its own tests and helpers use.

Monarch's ``PythonTask`` is a one-shot computation run on its Tokio runtime, and ``Shared`` the
result of a spawned one, which any number of waiters may observe.  Here both run on the process's
task loop (``monarch_agents.tasks``): a task started there runs beside the caller, in a copy of the
caller's context (``context()`` inside it is the caller's), and waiting for one from the task loop's
own thread raises ``WouldBlockRuntime`` instead of hanging, as Monarch's refuses to block Tokio.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from typing import Any, Awaitable, Callable, Coroutine, Generator, Generic, Optional, Sequence, Tuple, TypeVar

from monarch_agents import tasks

T = TypeVar("T")


class WouldBlockRuntime(RuntimeError):
    """Raised by a blocking wait made on the task loop's thread, which the awaited task needs."""


def _refuse_on_runner(what: str) -> None:
    if tasks.on_runner():
        raise WouldBlockRuntime(f"{what} cannot block on the task loop's thread; await it instead")


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class PythonTask(Generic[T]):
    """A one-shot computation: run it once, by ``block_on``, ``spawn``, ``spawn_handle`` or ``await``."""

    def __init__(self, coro: Coroutine[Any, Any, T]):
        self._coro: Coroutine[Any, Any, T] | None = coro
        self._taken = threading.Lock()

    def _take(self) -> Coroutine[Any, Any, T]:
        with self._taken:
            coro, self._coro = self._coro, None
        if coro is None:
            raise ValueError("PythonTask has already been run: it runs once")
        return coro

    @staticmethod
    def from_coroutine(coro: Coroutine[Any, Any, T]) -> "PythonTask[T]":
        """The task that runs ``coro``; inside it, ``await`` other tasks, ``Shared``s or futures."""
        if not asyncio.iscoroutine(coro):
            raise TypeError(f"from_coroutine expects a coroutine, got {type(coro).__name__}")
        return PythonTask(coro)

    def block_on(self) -> T:
        """Run the task and wait for its value (raises what it raised)."""
        _refuse_on_runner("PythonTask.block_on()")
        return tasks.submit(self._take()).result()

    def spawn(self) -> "Shared[T]":
        """Start the task now; its ``Shared`` result may be waited on any number of times."""
        return Shared(tasks.submit(self._take()))

    def spawn_handle(self) -> "Shared[T]":
        """Start the task now and return an observer of it (``get``, ``poll``, ``await``)."""
        return self.spawn()

    def __await__(self) -> Generator[Any, Any, T]:
        return self._take().__await__()

    def with_timeout(self, seconds: float) -> "PythonTask[T]":
        """The same task, failing with ``TimeoutError`` when not done within ``seconds``."""
        return PythonTask(asyncio.wait_for(self._take(), seconds))

    @staticmethod
    def select_one(tasks_: "Sequence[PythonTask[T]]") -> "PythonTask[Tuple[T, int]]":
        """Run the tasks together; the value is ``(value, index)`` of the first to finish."""
        coros = [t._take() for t in tasks_]

        async def first() -> Tuple[T, int]:
            running = [asyncio.ensure_future(c) for c in coros]
            try:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                winner = min(running.index(t) for t in done)
                return running[winner].result(), winner
            finally:
                for t in running:
                    t.cancel()

        return PythonTask(first())

    @staticmethod
    def sleep(seconds: float) -> "PythonTask[None]":
        """A task that finishes after ``seconds``."""
        return PythonTask(asyncio.sleep(seconds))

    @staticmethod
    def spawn_blocking(fn: Callable[[], T]) -> "Shared[T]":
        """Run ``fn`` on a thread of its own (so it may block), in a copy of the caller's context."""
        out: concurrent.futures.Future = concurrent.futures.Future()
        out.set_running_or_notify_cancel()  # running from now: nothing can cancel it
        ctx = contextvars.copy_context()

        def run() -> None:
            try:
                value = ctx.run(fn)
            except BaseException as e:  # noqa: BLE001 - what fn raised is the task's answer
                out.set_exception(e)
            else:
                out.set_result(value)

        threading.Thread(target=run, name="monarch-blocking", daemon=True).start()
        return Shared(out)


class Shared(Generic[T]):
    """The result of a started task: ``await`` it, ``block_on()`` it or ``poll()`` it, as often as needed."""

    def __init__(self, fut: concurrent.futures.Future):
        self._fut = fut

    @classmethod
    def from_value(cls, value: T) -> "Shared[T]":
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(value)
        return cls(fut)

    def __await__(self) -> Generator[Any, Any, T]:
        # shield: a waiter that is cancelled (the loser of a select_one) must not cancel the task
        return _awaited(asyncio.shield(asyncio.wrap_future(self._fut))).__await__()

    def block_on(self) -> T:
        if not self._fut.done():
            _refuse_on_runner("Shared.block_on()")
        return self._fut.result()

    def get(self, timeout: Optional[float] = None) -> T:
        if not self._fut.done():
            _refuse_on_runner("get()")
        return self._fut.result(timeout)

    def poll(self) -> Optional[T]:
        """The value when the task is done (raising what it raised), else None."""
        return self._fut.result() if self._fut.done() else None

    def task(self) -> "PythonTask[T]":
        """A one-shot task that waits for this result (to use ``with_timeout``, ``select_one``...)."""
        return PythonTask(_awaited(self))


#: Monarch's observe-only handle of a spawned task has the same surface here.
Handle = Shared


def is_tokio_thread() -> bool:
    """Whether this thread is the task loop's (Monarch: one of its Tokio runtime's threads)."""
    return tasks.on_runner()
