"""Rows of one table, buffered column by column in plain Python (no pyarrow here).

A client or proc records into :class:`RowBuffer`\\ s and hands them, a few times a
second, to its host agent, which turns them into Arrow (``table.py``).  Numbers go in
``array.array`` (one C value per row, no Python object kept); strings and nullable
values in lists (references to objects the caller already has).  Importing pyarrow
would cost a client ~0.2 s of start-up; this module costs nothing.
"""

from __future__ import annotations

import array
import threading

from monarch_telemetry.schema import F64, I64, TIME, TableSpec


def new_column(type_: str, nullable: bool):
    """An empty buffer for one column of ``type_``."""
    if not nullable and type_ in (I64, TIME):
        return array.array("q")
    if not nullable and type_ == F64:
        return array.array("d")
    return []


class RowBuffer:
    """Pending rows of one table; ``append`` is the hot path, ``take`` empties it."""

    __slots__ = ("spec", "limit", "_lock", "_cols", "_adds", "rows", "dropped")

    def __init__(self, spec: TableSpec, limit: int = 1_000_000):
        self.spec = spec
        #: Rows kept at most while nobody takes them (a host agent that stopped reading).
        self.limit = limit
        self._lock = threading.Lock()
        self.dropped = 0
        self._reset()

    def _reset(self) -> None:
        self._cols = [new_column(c.type, c.nullable) for c in self.spec.columns]
        self._adds = [c.append for c in self._cols]
        self.rows = 0

    def append(self, *values) -> None:
        """Add one row, values in column order (timestamps as integer microseconds since the epoch)."""
        with self._lock:
            if self.rows >= self.limit:
                self.dropped += 1
                return
            for add, v in zip(self._adds, values):
                add(v)
            self.rows += 1

    def appender(self):
        """A function ``add(v0, v1, ...)`` equal to :meth:`append`, unrolled for this table's columns.

        The hot path calls it once per message: no argument tuple walked, no loop (about half
        the cost of :meth:`append`).
        """
        n = len(self.spec.columns)
        args = ", ".join(f"v{i}" for i in range(n))
        calls = "\n".join(f"            adds[{i}](v{i})" for i in range(n))
        src = (f"def add({args}):\n"
               f"    with lock:\n"
               f"        if buf.rows >= buf.limit:\n"
               f"            buf.dropped += 1\n"
               f"        else:\n"
               f"            adds = buf._adds\n"
               f"{calls}\n"
               f"            buf.rows += 1\n")
        scope: dict = {"lock": self._lock, "buf": self}
        exec(compile(src, f"<RowBuffer {self.spec.name}>", "exec"), scope)  # our own text: column indices only
        return scope["add"]

    def take(self) -> tuple[int, list] | None:
        """(rows, columns) of everything pending, leaving the buffer empty; None when empty."""
        with self._lock:
            if not self.rows:
                return None
            out = (self.rows, self._cols)
            self._reset()
            return out
