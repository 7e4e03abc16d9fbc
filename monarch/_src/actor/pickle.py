"""Compatibility only: Monarch's ``flatten``/``unflatten`` (pickling with some objects kept out of
the bytes), on cloudpickle as monarch's meshes pickle."""

from __future__ import annotations

import io
from typing import Any, Callable, Iterable, Iterator

import cloudpickle


class Buffer(io.BytesIO):
    """Bytes being written; ``freeze()`` gives them for ``unflatten``."""

    def freeze(self) -> bytes:
        return self.getvalue()


class _Pickler(cloudpickle.Pickler):
    def __init__(self, keep_out: Callable[[Any], bool], f: io.BytesIO) -> None:
        super().__init__(f)
        self._keep_out = keep_out
        self.saved: list[Any] = []

    def persistent_id(self, obj: Any) -> Any:
        if not self._keep_out(obj):
            return None
        self.saved.append(obj)
        return len(self.saved) - 1


class _Unpickler(cloudpickle.pickle.Unpickler):  # type: ignore[name-defined]
    def __init__(self, data: bytes, values: Iterable[Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._iter: Iterator[Any] = iter(values)
        self._values: list[Any] = []

    def persistent_load(self, pid: Any) -> Any:
        while pid >= len(self._values):
            self._values.append(next(self._iter))
        return self._values[pid]


def flatten(obj: Any, filter: Callable[[Any], bool]) -> tuple[list[Any], Buffer]:
    """Pickle ``obj``; the objects ``filter`` picks are left out of the bytes and returned in a
    list, in the order the pickle meets them."""
    buf = Buffer()
    p = _Pickler(filter, buf)
    p.dump(obj)
    return p.saved, buf


def unflatten(data: bytes, values: Iterable[Any]) -> Any:
    """What ``flatten`` pickled, with ``values`` where it left objects out."""
    return _Unpickler(bytes(data), values).load()
