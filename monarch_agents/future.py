"""``Future``: the answer to a message, usable from plain and async code.

``fut.get(timeout=2.0)`` blocks the calling thread; a timeout raises
``TimeoutError`` and leaves the future as it was, so it can be waited on again.
``await fut`` works in any asyncio loop.  Results arrive on the IO thread.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Callable, Generic, TypeVar

R = TypeVar("R")

_PENDING, _OK, _ERR = 0, 1, 2

_modules = sys.modules
_getframe = sys._getframe
#: Modules whose get() calls are monarch's own, made inside a synchronous API call (spawn_procs,
#: stop, ...): the warning is for the program's.
_OURS = ("monarch.", "monarch_agents.")


def _warn_blocking_on_loop() -> None:
    """Monarch's ``Future.get()`` warns when it would block a running asyncio loop: nothing else on
    that loop runs until the answer comes, and an answer that waits on one of its tasks never does."""
    warnings.warn("Future.get() blocks this thread's running asyncio event loop until the answer comes; "
                  "await the Future (or its as_asyncio()) instead", UserWarning, stacklevel=3)


#: The mailbox whose IO loop a thread waiting in :meth:`Future.get` may run itself (a proc's: see
#: ``Mailbox.run_until``), or None: the waiting thread sleeps until the IO thread wakes it.
process_loop: Any = None


def _main_ident() -> int | None:
    return threading.main_thread().ident



def _call_soon(loop: Any, fn: Callable[[], Any]) -> None:
    """Run ``fn`` on ``loop``'s thread, unless the loop has closed: then no one awaits there any
    more (``asyncio.run`` returned, or ended at Ctrl-C, with the call still out), and the answer
    that came late, or the failure of a call stopped at exit, is nobody's to hear."""
    if loop.is_closed():
        return
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # closed between the look and the call
        if not loop.is_closed():
            raise

class Future(Generic[R]):
    """A value that will be available later."""

    __slots__ = ("_state", "_value", "_done", "_callbacks", "_lock", "_transform", "_resolved", "_polled_by",
                 "_sleeping", "__weakref__")

    def __init__(self, transform: Callable[[Any], R] | None = None):
        self._state = _PENDING
        self._value: Any = None
        # Held until the value is in: a bare lock is the cheapest thing a thread can sleep on
        # (an Event is a Condition, a lock and a list of waiters, made anew for every call).
        self._done = threading.Lock()
        self._done.acquire()
        self._callbacks: list[Callable[["Future"], None]] | None = None
        self._lock = threading.Lock()
        self._transform = transform
        self._resolved = False
        #: The mailbox whose loop a waiting thread may run (set by the first waiter, kept), and the one
        #: in whose count of sleepers a waiting thread is.
        self._polled_by: Any = None
        self._sleeping: Any = None

    @classmethod
    def completed(cls, value: Any) -> "Future":
        f = cls()
        f.set_result(value)
        return f

    @classmethod
    def _from_coro(cls, coro: Any) -> "Future":
        """Monarch's future of a coroutine (or of anything awaitable, such as a ``PythonTask``).

        It starts when first used, as Monarch's does: ``await`` runs it on the awaiting loop, and
        ``get()``, ``add_done_callback()`` run it on the process's task loop (``monarch_agents.tasks``)."""
        return _CoroFuture(coro)

    # -- producer side -------------------------------------------------------

    def set_result(self, value: Any) -> None:
        self._finish(_OK, value)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(_ERR, exc)

    def _finish(self, state: int, value: Any) -> None:
        # acquire/release rather than ``with``: the hot path (every answer) pays for the lookup
        # of __enter__ and __exit__ and a bound method each time; nothing here can raise.
        lock = self._lock
        lock.acquire()
        if self._state != _PENDING:
            lock.release()
            return
        self._state, self._value = state, value
        callbacks, self._callbacks = self._callbacks, None
        lock.release()
        self._done.release()
        if self._sleeping is not None:
            self._sleeping.sleep_end(self)
        if self._polled_by is not None:
            # Finished off the loop: a waiter that runs it must look.  Also when another waiter
            # sleeps: two threads may wait on one future, one running the loop, one asleep.
            self._polled_by.wake_borrower()
        if callbacks is not None:
            for cb in callbacks:
                cb(self)

    def add_done_callback(self, fn: Callable[["Future"], None]) -> None:
        with self._lock:
            if self._state == _PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    # -- consumer side -------------------------------------------------------

    def done(self) -> bool:
        return self._state != _PENDING

    def _outcome(self) -> Any:
        if self._state == _OK and self._transform is not None and not self._resolved:
            with self._lock:
                if not self._resolved:
                    try:
                        self._value = self._transform(self._value)
                    except BaseException as e:  # decoding the answer failed: that is the answer
                        self._state, self._value = _ERR, e
                    self._resolved = True
        if self._state == _ERR:
            raise self._value
        return self._value

    def get(self, timeout: float | None = None) -> R:
        """Wait for the value; raise what the remote side raised."""
        if self._state == _PENDING:
            aio = _modules.get("asyncio")  # not imported: no loop can be running
            if aio is not None and aio._get_running_loop() is not None \
                    and not _getframe(1).f_globals.get("__name__", "").startswith(_OURS):
                _warn_blocking_on_loop()  # the program's own get(); ours (inside spawn_procs, ...) are not its to fix
            mb = process_loop
            if mb is None:
                self._block(timeout)
            else:
                self._wait_on(mb, timeout)
        return self._outcome()

    def _block(self, timeout: float | None) -> None:
        if not self._done.acquire(True, -1 if timeout is None else max(timeout, 0)):  # positional: no keyword parsing
            raise TimeoutError(f"no answer within {timeout} s")
        self._done.release()  # for the next waiter

    def _wait_on(self, mb: Any, timeout: float | None) -> None:
        """Wait in a process whose loop may be lent (``Mailbox.run_until``): run it here when free,
        else sleep counted among its sleepers (a borrower that stops polling hands it back then).
        The main thread never runs it: a signal's handler (Ctrl-C's KeyboardInterrupt) could stop
        it in the middle of a message."""
        if threading.get_ident() != _main_ident():
            # Left set once any thread waited here (never cleared: another waiter may be running the
            # loop for this future meanwhile); a stale mark costs a look at who runs the loop.
            self._polled_by = mb
            got = mb.run_until(self.done, timeout)
            if got:
                return
            if got is False and timeout is not None:
                raise TimeoutError(f"no answer within {timeout} s")
        mb.sleep_begin(self)
        if self._state != _PENDING:  # finished meanwhile (its finisher saw no sleeper to count off)
            mb.sleep_end(self)
            return
        try:
            self._block(timeout)
        finally:
            mb.sleep_end(self)

    def result(self, timeout: float | None = None) -> R:
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.get(timeout)
        except TimeoutError:
            raise
        except BaseException as e:
            return e
        return None

    def __await__(self):
        if self._state == _PENDING:
            import asyncio  # here, not at the top: plain `monarch run` never awaits and asyncio costs ~20 ms

            loop = asyncio.get_running_loop()
            waiter = loop.create_future()

            def wake(_: Future) -> None:
                _call_soon(loop, lambda: waiter.done() or waiter.set_result(None))

            self.add_done_callback(wake)
            yield from waiter.__await__()
        return self._outcome()

    def as_asyncio(self) -> Any:
        """An ``asyncio.Future`` of the running loop that resolves when this one does (each call a new one).

        Raises ``RuntimeError`` off a running event loop."""
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("as_asyncio() requires a running asyncio event loop") from None
        out = loop.create_future()

        def settle() -> None:
            if out.done():
                return
            try:
                out.set_result(self._outcome())
            except BaseException as e:  # noqa: BLE001 - the outcome itself is the exception
                out.set_exception(RuntimeError("coroutine raised StopIteration") if isinstance(e, StopIteration) else e)

        self.add_done_callback(lambda _: _call_soon(loop, settle))
        return out

    def __repr__(self) -> str:
        state = {_PENDING: "pending", _OK: "done", _ERR: "failed"}[self._state]
        return f"<Future {state}>"


class _CoroFuture(Future):
    """A ``Future`` whose value a coroutine computes, started by its first user."""

    __slots__ = ("_coro",)

    def __init__(self, coro: Any):
        super().__init__()
        self._coro: Any = coro

    def _start(self, loop: Any = None) -> None:
        if self._coro is None:
            return
        with self._lock:
            coro, self._coro = self._coro, None
        if coro is None:
            return

        async def drive() -> None:
            try:
                value = await coro
            except BaseException as e:  # noqa: BLE001 - what the coroutine raised is this future's answer
                self.set_exception(e)
            else:
                self.set_result(value)

        if loop is not None:
            loop.create_task(drive())
        else:
            from monarch_agents import tasks

            tasks.submit(drive())

    def add_done_callback(self, fn: Callable[["Future"], None]) -> None:
        self._start()
        super().add_done_callback(fn)

    def get(self, timeout: float | None = None) -> Any:
        if self._state == _PENDING:
            from monarch_agents import tasks

            if tasks.on_runner():
                # Its coroutine needs this very loop to make progress: waiting here would hang forever.
                raise RuntimeError("Future.get() cannot block on the task loop's thread; await it instead")
            self._start()
        return super().get(timeout)

    def __await__(self):
        if self._coro is not None:
            import asyncio

            self._start(asyncio.get_running_loop())
        return super().__await__()

    def as_asyncio(self) -> Any:
        if self._coro is not None:
            import asyncio

            try:
                self._start(asyncio.get_running_loop())
            except RuntimeError:
                pass  # super() says why
        return super().as_asyncio()
