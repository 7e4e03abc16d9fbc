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
    """Pending rows of one table; ``append`` is the hot path, ``take`` empties it.

    A row is kept as the tuple it came in (one list append under a lock: the hot path records
    one per message, and ten column appends cost several times that); :meth:`take` turns the
    rows into columns, in C, off the hot path.
    """

    __slots__ = ("spec", "limit", "_lock", "_rows", "dropped", "_kinds")

    def __init__(self, spec: TableSpec, limit: int = 1_000_000):
        self.spec = spec
        #: Rows kept at most while nobody takes them (a host agent that stopped reading).
        self.limit = limit
        self._lock = threading.Lock()
        self.dropped = 0
        self._rows: list[tuple] = []
        #: Each column's buffer kind: an array typecode, or "" for a list.
        self._kinds = [_kind(c.type, c.nullable) for c in spec.columns]

    @property
    def rows(self) -> int:
        return len(self._rows)

    def append(self, *values) -> None:
        """Add one row, values in column order (timestamps as integer microseconds since the epoch)."""
        with self._lock:
            if len(self._rows) >= self.limit:
                self.dropped += 1
                return
            self._rows.append(values)

    def appender(self):
        """A function ``add(v0, v1, ...)`` equal to :meth:`append`, for the hot path (no attribute
        looked up per call)."""
        lock, buf, limit = self._lock, self, self.limit

        def add(*values) -> None:
            with lock:
                rows = buf._rows
                if len(rows) >= limit:
                    buf.dropped += 1
                else:
                    rows.append(values)
        return add

    def take(self) -> tuple[int, list] | None:
        """(rows, columns) of everything pending, leaving the buffer empty; None when empty."""
        with self._lock:
            rows, self._rows = self._rows, []
        if not rows:
            return None
        try:
            return len(rows), self._columns(rows)
        except (TypeError, ValueError, OverflowError):
            # A row with a value its column cannot hold (or of the wrong length): drop those rows
            # only, as appending them one column at a time would have refused them.
            good = [r for r in rows if self._fits(r)]
            self.dropped += len(rows) - len(good)
            return (len(good), self._columns(good)) if good else None

    def _columns(self, rows: list[tuple]) -> list:
        if set(map(len, rows)) != {len(self._kinds)}:
            raise ValueError("a row of the wrong length")
        return [array.array(k, col) if k else list(col) for k, col in zip(self._kinds, zip(*rows))]

    def _fits(self, row: tuple) -> bool:
        try:
            self._columns([row])
            return True
        except (TypeError, ValueError, OverflowError):
            return False


def _kind(type_: str, nullable: bool) -> str:
    col = new_column(type_, nullable)
    return col.typecode if isinstance(col, array.array) else ""
