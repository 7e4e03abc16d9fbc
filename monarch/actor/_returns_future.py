"""``@returns_future``: an ``async def`` that returns a :class:`monarch.actor.Future`, as in Monarch.

Calling the function starts nothing.  The body runs when the future is first observed: ``await``
(or ``as_asyncio()``) runs it as a task on the awaiting loop; ``.get()`` from plain code runs it to
the end on a loop of the calling thread, as ``asyncio.run`` would (from inside a running loop, on a
short-lived helper thread instead).  It runs at most once; every observer sees its one outcome.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

from monarch_agents.future import Future

R = TypeVar("R")


class _Deferred(Future):
    """A future whose body (a coroutine) starts when it is first observed."""

    __slots__ = ("_body", "_ctx", "_start_lock")

    def __init__(self, body: Coroutine[Any, Any, Any], ctx: contextvars.Context):
        super().__init__()
        self._body: Coroutine[Any, Any, Any] | None = body
        self._ctx = ctx
        self._start_lock = threading.Lock()

    def _take(self) -> Coroutine[Any, Any, Any] | None:
        with self._start_lock:
            body, self._body = self._body, None
        return body

    async def _drive(self, body: Coroutine[Any, Any, Any]) -> None:
        try:
            self.set_result(await body)
        except BaseException as e:  # noqa: BLE001 - the body's exception is its outcome
            self.set_exception(e)

    def get(self, timeout: float | None = None) -> Any:
        body = self._take()
        if body is not None:
            import asyncio

            try:
                asyncio.get_running_loop()
                in_loop = True
            except RuntimeError:
                in_loop = False
            if in_loop:  # a second loop cannot run here: a helper thread runs the body
                threading.Thread(target=lambda: self._ctx.run(asyncio.run, self._drive(body)),
                                 name="returns-future", daemon=True).start()
            else:
                self._ctx.run(asyncio.run, self._drive(body))
        return super().get(timeout)

    def __await__(self):
        body = self._take()
        if body is not None:
            import asyncio

            task = asyncio.get_running_loop().create_task(self._drive(body), context=self._ctx)
            _running.add(task)
            task.add_done_callback(_running.discard)
        return (yield from super().__await__())

    def as_asyncio(self) -> Any:
        body = self._take()
        if body is not None:
            import asyncio

            task = asyncio.get_running_loop().create_task(self._drive(body), context=self._ctx)
            _running.add(task)
            task.add_done_callback(_running.discard)
        return super().as_asyncio()

    def __del__(self) -> None:
        body = getattr(self, "_body", None)
        if body is not None:
            body.close()  # never observed: none of its code runs


#: Tasks started by an ``await``: asyncio holds tasks only weakly.
_running: set = set()


def returns_future(fn: Callable[..., Awaitable[R]]) -> Callable[..., Future[R]]:
    """Make ``async def fn`` return a ``monarch.actor.Future`` that plain code can ``.get()`` and
    async code can ``await``."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"returns_future decorates an async def, not {fn!r}")

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Future[R]:
        return _Deferred(fn(*args, **kwargs), contextvars.copy_context())

    return call
