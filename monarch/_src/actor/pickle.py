"""Compatibility only: Monarch's ``flatten``/``unflatten`` (pickling with some objects kept out of
the bytes), on cloudpickle as monarch's meshes pickle."""

from __future__ import annotations

import io
from typing import Any, Callable, Iterable, Iterator

import cloudpickle


class FrozenBuffer:
    """Bytes to read once, from the front (Monarch's ``FrozenBuffer``): ``read``, ``readline``,
    ``readinto``; ``len()`` is what is left, ``bytes()`` gives it without reading it."""

    def __init__(self, data: bytes = b"") -> None:
        self._data = memoryview(bytes(data))
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size is None or size < 0 else min(len(self._data), self._pos + size)
        out = self._data[self._pos:end].tobytes()
        self._pos = end
        return out

    def readline(self, size: int = -1) -> bytes:
        rest = self._data[self._pos:] if size is None or size < 0 else self._data[self._pos:self._pos + size]
        nl = rest.tobytes().find(b"\n")
        return self.read(len(rest) if nl < 0 else nl + 1)

    def readinto(self, b: Any) -> int:
        dest = memoryview(b).cast("B")
        n = min(len(dest), len(self))
        dest[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n

    def __len__(self) -> int:
        return len(self._data) - self._pos

    def __bytes__(self) -> bytes:
        return self._data[self._pos:].tobytes()

    def __str__(self) -> str:
        return repr(bytes(self))


class Buffer:
    """Bytes being written (Monarch's ``Buffer``): ``write`` keeps each piece (a copy of a mutable
    one), ``freeze()`` hands them all to a :class:`FrozenBuffer` and leaves this one empty."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._len = 0

    def write(self, buff: Any) -> int:
        b = buff if isinstance(buff, bytes) else bytes(memoryview(buff))
        self._parts.append(b)
        self._len += len(b)
        return len(b)

    def __len__(self) -> int:
        return self._len

    def freeze(self) -> FrozenBuffer:
        data = b"".join(self._parts)
        self._parts, self._len = [], 0
        return FrozenBuffer(data)


class _Pickler(cloudpickle.Pickler):
    def __init__(self, keep_out: Callable[[Any], bool], f: Buffer) -> None:
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


def unflatten(data: bytes | FrozenBuffer, values: Iterable[Any]) -> Any:
    """What ``flatten`` pickled, with ``values`` where it left objects out."""
    return _Unpickler(bytes(data), values).load()
