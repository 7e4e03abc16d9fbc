"""Streams: independent queues of ops on every proc, as in PyTorch Monarch.

Ops issued under ``with stream.activate():`` run on that stream's own thread on
each worker, in order, and overlap with other streams' ops.  A tensor belongs to
the stream that made it; another stream uses it through :meth:`Stream.borrow`,
which orders the two: the borrowing stream waits until the tensor is made, and
once the borrow is dropped the lender waits until the borrower is done with it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Iterator

_ids = itertools.count(1)


class Stream:
    """A named stream of ops on every proc of a mesh."""

    def __init__(self, name: str, _default: bool = False):
        self.name = name
        self.default = _default
        self.id = 0 if _default else next(_ids)

    def activate(self) -> contextlib.AbstractContextManager:
        """Ops issued inside the block run on this stream."""
        return _activate(self)

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, "Borrow"]:
        """``t`` for use on this stream, and the borrow to drop when done with it."""
        from monarch._tensor.tensor import borrow

        return borrow(self, t, mutable)

    def __repr__(self) -> str:
        return f"<Stream({self.name!r})>"

    def __str__(self) -> str:
        return f"stream {self.name!r}"


class Borrow:
    """A tensor lent to another stream; :meth:`drop` gives it back."""

    def __init__(self, drop: Any):
        self._drop = drop
        self._dropped = False

    def drop(self) -> None:
        if not self._dropped:
            self._dropped = True
            self._drop()

    def __enter__(self) -> "Borrow":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drop()


_default = Stream("main", _default=True)
_local = threading.local()


def get_active_stream() -> Stream:
    """The stream ops go to now (``main`` unless a ``stream.activate()`` block says otherwise)."""
    return getattr(_local, "stream", _default)


@contextlib.contextmanager
def _activate(stream: Stream) -> Iterator[None]:
    old = get_active_stream()
    _local.stream = stream
    try:
        yield
    finally:
        _local.stream = old
