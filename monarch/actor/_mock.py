"""``patch_actor(Real, Mock)``: spawning ``Real`` spawns ``Mock`` instead, as Monarch's test helper does.

Works as a context manager or a decorator (sync or async), nests, and reaches the procs: a
mesh spawned while a patch is active first gives its procs the patches, so an actor there that
spawns ``Real`` gets ``Mock`` too.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from typing import Any, Callable

_registry: dict[type, type] = {}
_lock = threading.Lock()
_version = itertools.count(1)
_current_version = 0


def actor_class(cls: type) -> type:
    """The class to spawn for ``cls``: its mock while one is patched in, else ``cls``."""
    return _registry.get(cls, cls) if _registry else cls


def registry_state() -> tuple[int, dict[type, type]]:
    with _lock:
        return _current_version, dict(_registry)


def set_registry_state(state: dict[type, type]) -> None:
    """In a proc: the patches of the process that spawned on it."""
    global _current_version
    with _lock:
        _registry.clear()
        _registry.update(state)
        _current_version = next(_version)


class patch_actor:
    """While active, ``mesh.spawn(name, original, ...)`` spawns ``mock`` (same arguments)."""

    def __init__(self, original: type, mock: type):
        self.original = original
        self.mock = mock
        self._previous: list[Any] = []

    def __enter__(self) -> type:
        global _current_version
        with _lock:
            self._previous.append(_registry.get(self.original))
            _registry[self.original] = self.mock
            _current_version = next(_version)
        return self.mock

    def __exit__(self, *exc: Any) -> None:
        global _current_version
        with _lock:
            prev = self._previous.pop()
            if prev is None:
                _registry.pop(self.original, None)
            else:
                _registry[self.original] = prev
            _current_version = next(_version)

    async def __aenter__(self) -> type:
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                async with self:
                    return await fn(*args, **kwargs)
            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
        return run
