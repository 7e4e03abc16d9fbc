"""Bounded in-memory Arrow tables: cheap appends, sealed into record batches, oldest dropped first.

A :class:`Table` is a schema plus ``append``.  ``append(*values)`` writes one row into
per-column buffers (``array.array`` for numbers, so no Python object is kept per value;
a plain list for strings, which holds references to strings the caller already has).
Every ``batch_rows`` rows the buffers are sealed into one ``pyarrow.RecordBatch``.  The
sealed batches form a ring bounded by rows and by bytes: when either bound is passed, the
oldest batches go.  Readers (a query, a Parquet save, a push to the host agent) get the
sealed batches plus the rows still in the buffers, without stopping writers for more than
a copy of the buffers.

A :class:`Store` is the set of tables of one process, and the snapshot tables it can build
on demand.  Bounds come from the arguments or from ``MONARCH_TELEMETRY_ROWS`` and
``MONARCH_TELEMETRY_BYTES`` (per table).

What it does not do: queries (``engine.py``), or durability (``parquet.py`` saves on request).
"""

from __future__ import annotations

import array
import os
import threading
from collections import deque
from typing import Callable, Iterable

import pyarrow as pa

from monarch_telemetry.buffer import RowBuffer
from monarch_telemetry.schema import TABLES, TableSpec

#: Default bounds per table: enough for hours of a busy job, small next to a training process.
DEFAULT_MAX_ROWS = 2_000_000
DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_BATCH_ROWS = 8192

#: The tables a retention (Monarch's ``TelemetryConfig.retention_secs``) bounds by age, as Monarch's
#: collector does (messages, their events, sends, spans, metrics); the others (meshes, actors, their
#: statuses, logs...) keep their rows until the ring's bounds drop them.
RETAINED = ("messages_ext", "message_status_events_ext", "sent_messages_ext", "user_spans", "metrics")

ROWS_ENV = "MONARCH_TELEMETRY_ROWS"
BYTES_ENV = "MONARCH_TELEMETRY_BYTES"
def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(float(text))
    except ValueError:
        return default
    return value if value > 0 else default


class Table:
    """One bounded, append-only Arrow table."""

    def __init__(self, spec: TableSpec, *, max_rows: int | None = None, max_bytes: int | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS):
        self.spec = spec
        self.schema = spec.schema
        self.max_rows = max_rows or _env_int(ROWS_ENV, DEFAULT_MAX_ROWS)
        self.max_bytes = max_bytes or _env_int(BYTES_ENV, DEFAULT_MAX_BYTES)
        self.batch_rows = max(1, min(batch_rows, self.max_rows))
        self._fields = list(self.schema)
        self._buffer = RowBuffer(spec, limit=max(self.batch_rows * 4, 1))
        self._lock = threading.Lock()
        self._batches: deque[pa.RecordBatch] = deque()
        self._rows = 0  # in sealed batches
        self._bytes = 0
        self.dropped_rows = 0
        #: Rows older than this (microseconds, by the table's first time column) are dropped when read;
        #: 0: no age bound.
        self.max_age_us = 0
        self._swept_us = 0  # when rows were last dropped for their age
        self._age_col = next((i for i, c in enumerate(spec.columns) if c.name in ("timestamp_us", "time")), None)

    # -- writing ---------------------------------------------------------------------

    def append(self, *values) -> None:
        """Add one row, values in column order (timestamps as integer microseconds)."""
        buf = self._buffer
        buf.append(*values)
        if buf.rows >= self.batch_rows:
            self._seal()

    def append_columns(self, rows: int, columns: list) -> None:
        """Add rows another process buffered (a :meth:`RowBuffer.take`)."""
        if rows:
            batch = pa.RecordBatch.from_arrays([column_to_arrow(c, f.type) for c, f in zip(columns, self._fields)],
                                               schema=self.schema)
            with self._lock:
                self._push(batch)

    def append_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Add Arrow rows (same columns; missing ones become null)."""
        batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        with self._lock:
            for b in batches:
                if b.num_rows:
                    self._push(b if b.schema == self.schema else _conform(b, self.schema))

    def _seal(self) -> None:
        taken = self._buffer.take()
        if taken is not None:
            self.append_columns(*taken)

    def _push(self, b: pa.RecordBatch) -> None:
        self._batches.append(b)
        self._rows += b.num_rows
        self._bytes += b.nbytes
        while self._rows > self.max_rows or self._bytes > self.max_bytes:
            old = self._batches.popleft()
            self._rows -= old.num_rows
            self._bytes -= old.nbytes
            if self._batches:
                self.dropped_rows += old.num_rows
                continue
            # Only one batch, and it alone is over a bound: keep its newest rows that fit.
            keep = min(self.max_rows, int(old.num_rows * self.max_bytes / max(old.nbytes, 1)))
            keep = max(0, min(keep, old.num_rows - 1))
            self.dropped_rows += old.num_rows - keep
            if keep:
                # A slice keeps its parent's buffers alive: copy, so the bytes really go.
                kept = _compact(old.slice(old.num_rows - keep))
                self._batches.append(kept)
                self._rows += kept.num_rows
                self._bytes += kept.nbytes
            break

    def _expire(self) -> None:
        """Drop the rows older than ``max_age_us`` (under the lock), as Monarch's retention sweeps do: at
        most once per tenth of the window, between 30 s and 5 min and never more than the window apart,
        so a row stays readable up to that long past its age."""
        if not self.max_age_us or self._age_col is None:
            return
        import pyarrow.compute as pc

        from monarch_telemetry.recorder import now_us

        now = now_us()
        every = min(self.max_age_us, max(30_000_000, min(self.max_age_us // 10, 300_000_000)))
        if now - self._swept_us < every:
            return
        self._swept_us = now
        cutoff = now - self.max_age_us
        # Every batch is looked at (rows pushed by several procs arrive a little out of time order);
        # a sweep is rare, and costs one min() per batch.
        kept: deque[pa.RecordBatch] = deque()
        for b in self._batches:
            ts = b.column(self._age_col)
            if pa.types.is_timestamp(ts.type):
                ts = ts.cast(pa.int64())
            oldest = pc.min(ts).as_py()
            if oldest is None or oldest >= cutoff:
                kept.append(b)
                continue
            young = _compact(b.filter(pc.greater_equal(ts, cutoff)))
            self.dropped_rows += b.num_rows - young.num_rows
            if young.num_rows:
                kept.append(young)
        self._batches = kept
        self._rows = sum(b.num_rows for b in kept)
        self._bytes = sum(b.nbytes for b in kept)

    # -- reading ---------------------------------------------------------------------

    def batches(self) -> list[pa.RecordBatch]:
        """Every row held, oldest first (pending rows are sealed first)."""
        self._seal()
        with self._lock:
            self._expire()
            return list(self._batches)

    def drain(self) -> list[pa.RecordBatch]:
        """Take every row held, leaving the table empty."""
        self._seal()
        with self._lock:
            self._expire()
            out = list(self._batches)
            self._batches.clear()
            self._rows = self._bytes = 0
            return out

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_batches(self.batches(), schema=self.schema)

    @property
    def num_rows(self) -> int:
        return self._rows + self._buffer.rows

    @property
    def nbytes(self) -> int:
        return self._bytes


def column_to_arrow(col, t: pa.DataType) -> pa.Array:
    if isinstance(col, pa.Array):
        return col
    if isinstance(col, array.array):
        # Zero-copy view over the typed array (it is not written again: new buffers were made).
        storage = pa.int64() if col.typecode == "q" else pa.float64()
        arr = pa.Array.from_buffers(storage, len(col), [None, pa.py_buffer(col)])
        return arr if storage == t else arr.view(t)
    return pa.array(col, type=t)


def project(b: pa.RecordBatch, spec: TableSpec) -> pa.RecordBatch:
    """Rows of ``spec.source`` with only ``spec``'s columns (its first ones): no copy of the data."""
    n = len(spec.columns)
    return pa.RecordBatch.from_arrays(b.columns[:n], schema=spec.schema)


def _compact(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.Table.from_batches([b]).combine_chunks().to_batches()[0] if b.num_rows else b


def _conform(b: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``b`` with ``schema``'s columns (missing ones null), for rows from an older or newer peer."""
    cols = []
    for f in schema:
        i = b.schema.get_field_index(f.name)
        cols.append(b.column(i).cast(f.type) if i >= 0 else pa.nulls(b.num_rows, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


Snapshot = Callable[[], Iterable[dict]]


class Store:
    """The telemetry tables of one process: event tables, plus snapshot tables built when read."""

    def __init__(self, *, max_rows: int | None = None, max_bytes: int | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS, specs: Iterable[TableSpec] | None = None):
        self.tables: dict[str, Table] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self._sources: dict[str, TableSpec] = {}
        for spec in specs if specs is not None else TABLES.values():
            if spec.source:
                self._sources[spec.name] = spec  # read from its source's rows (see ``batches``)
            elif spec.kind == "event":
                self.tables[spec.name] = Table(spec, max_rows=max_rows, max_bytes=max_bytes, batch_rows=batch_rows)

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]

    def retain(self, max_age_s: float) -> None:
        """Keep the rows of the :data:`RETAINED` tables only ``max_age_s`` seconds (0: no age bound),
        swept as Monarch's are (see :meth:`Table._expire`)."""
        for name in RETAINED:
            t = self.tables.get(name)
            if t is not None:
                t.max_age_us = int(max_age_s * 1e6) if max_age_s > 0 else 0

    def provide(self, name: str, rows: Snapshot) -> None:
        """Build snapshot table ``name`` from ``rows()`` (dicts keyed by column) each time it is read."""
        self.snapshots[name] = rows

    def batches(self, name: str) -> list[pa.RecordBatch]:
        """The rows of table ``name`` now (an empty list for a table this process does not hold)."""
        if name in self.tables:
            return self.tables[name].batches()
        narrow = self._sources.get(name)
        if narrow is not None:
            source = self.tables.get(narrow.source)
            return [] if source is None else [project(b, narrow) for b in source.batches()]
        fn = self.snapshots.get(name)
        if fn is None:
            return []
        spec = TABLES[name]
        rows = list(fn())
        return [pa.RecordBatch.from_pylist(rows, schema=spec.schema)] if rows else []

    def names(self) -> list[str]:
        return [*self.tables, *(n for n, s in self._sources.items() if s.source in self.tables), *self.snapshots]

    def drain(self) -> dict[str, list[pa.RecordBatch]]:
        """Take every event row held (see :meth:`Table.drain`), by table; empty tables left out."""
        out = {}
        for name, t in self.tables.items():
            if t.num_rows:
                b = t.drain()
                if b:
                    out[name] = b
        return out

    def absorb(self, taken: dict[str, tuple[int, list]]) -> None:
        """Append rows a :class:`~monarch_telemetry.recorder.Recorder` took: {table: (rows, columns)}.

        Unknown tables are ignored; handled messages become ``messages_ext`` and ``message_status_events_ext``.
        """
        from monarch_telemetry.recorder import MESSAGE_LOG, derive_messages

        for name, (rows, columns) in taken.items():
            if name == MESSAGE_LOG.name:
                if "messages_ext" in self.tables and len(columns) == len(MESSAGE_LOG.columns):
                    msgs, events = derive_messages(rows, columns)
                    self.tables["messages_ext"].append_batch(msgs)
                    self.tables["message_status_events_ext"].append_batch(events)
                continue
            t = self.tables.get(name)
            if t is not None and len(columns) == len(t._fields):
                t.append_columns(rows, columns)

    @property
    def num_rows(self) -> int:
        return sum(t.num_rows for t in self.tables.values())

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tables.values())


# -- Arrow IPC: how batches cross processes ------------------------------------------------


def to_ipc(batches: list[pa.RecordBatch], schema: pa.Schema) -> bytes:
    """Batches as one Arrow IPC stream (what a query answer or a push carries)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes | memoryview) -> pa.Table:
    with pa.ipc.open_stream(pa.py_buffer(data)) as r:
        return r.read_all()


__all__ = ["Table", "Store", "to_ipc", "from_ipc", "column_to_arrow", "project"]
