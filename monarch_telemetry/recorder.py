"""What a process records: one :class:`Recorder` per process, cheap enough for the hot path.

Procs and clients call the ``Recorder`` methods below; each is one ``RowBuffer.append``
(a lock and a few C appends, no object per row).  A flusher thread hands the buffers to
the process's host agent a few times a second (``start_flusher``), where they become
Arrow.  Handled messages are recorded once, at completion, into an internal buffer with
all four timestamps; the host agent derives both ``messages_ext`` and
``message_status_events_ext`` from it in one vectorised step (``derive_messages``).

``MONARCH_TELEMETRY=0`` turns recording off: every method returns at once.

What it does not do: store rows for long (host agents do), or import pyarrow.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import random
import sys
import threading
import time
from typing import Any, Callable, Sequence

from monarch_telemetry.buffer import RowBuffer
from monarch_telemetry.schema import I64, STR, TABLES, Column, TableSpec

log = logging.getLogger("monarch.telemetry")

#: Internal: one row per handled message, all timestamps in one place.  The host agent
#: turns it into ``messages`` and ``message_status_events`` (see :func:`derive_messages`).
MESSAGE_LOG = TableSpec("_message_log", "internal", "handled messages, as recorded", (
    Column("id", I64, ""), Column("queued_us", I64, ""), Column("active_us", I64, ""), Column("done_us", I64, ""),
    Column("from_actor_id", I64, ""), Column("to_actor_id", I64, ""), Column("endpoint", STR, "", True),
    Column("port_index", I64, "", True), Column("host", STR, ""), Column("status", STR, ""),
))

_RECORDED = ("meshes_ext", "actors_ext", "actor_status_events_ext", "sent_messages_ext", "logs", "user_spans",
             "metrics")
FLUSH_INTERVAL_S = 0.2


_time_ns = time.time_ns


def now_us() -> int:
    return time.time_ns() // 1000


def hash_id(name: str) -> int:
    """A 63-bit id for a name, the same in every process (actors and meshes are named, not numbered)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") & 0x7FFF_FFFF_FFFF_FFFF


def _enabled() -> bool:
    return os.environ.get("MONARCH_TELEMETRY", "1").strip().lower() not in ("0", "off", "false", "no")


class Recorder:
    """The rows this process has recorded and not yet handed on."""

    def __init__(self, host: str = "", *, enabled: bool | None = None):
        self.host = host or os.environ.get("MONARCH_HOSTNAME") or _hostname()
        self.on = _enabled() if enabled is None else enabled
        self.pid = os.getpid()
        self.buffers: dict[str, RowBuffer] = {n: RowBuffer(TABLES[n]) for n in _RECORDED}
        self.buffers[MESSAGE_LOG.name] = RowBuffer(MESSAGE_LOG)
        # Ids unique across processes without coordination: 28 random bits, then a counter.
        self._ids = itertools.count((random.getrandbits(28) << 32) + 1)
        self._meshes = self.buffers["meshes_ext"].append
        self._actors = self.buffers["actors_ext"].append
        self._status = self.buffers["actor_status_events_ext"].append
        self._sent = self.buffers["sent_messages_ext"].appender()
        self._logs = self.buffers["logs"].appender()
        self._msgs = self.buffers[MESSAGE_LOG.name].appender()
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()

    def new_id(self) -> int:
        return next(self._ids)

    # -- what gets recorded --------------------------------------------------------------

    def mesh(self, mesh_id: int, cls: str, given_name: str, full_name: str, labels: tuple, sizes: tuple,
             parent_mesh_id: int | None = None, parent_labels: tuple = (), parent_sizes: tuple = (),
             parent_indices: Sequence[int] | None = None) -> None:
        """``parent_indices``: which members of the parent's base the (possibly sliced) parent covers."""
        if self.on:
            parent_view = (region_json(parent_labels, parent_sizes, parent_indices) if parent_mesh_id is not None
                           else None)
            self._meshes(mesh_id, now_us(), cls, given_name, full_name, shape_json(labels, sizes),
                         parent_mesh_id, parent_view, self.host)

    def actor(self, actor_id: int, mesh_id: int, rank: int, full_name: str, display_name: str | None,
              ref_name: str | None = None, *, host: str | None = None, pid: int | None = -1) -> None:
        """``host``/``pid``: where the actor runs when that is not this process (an agent's row the
        client records; ``pid`` None: not known here)."""
        if self.on:
            self._actors(actor_id, now_us(), mesh_id, rank, full_name, display_name, host or self.host,
                         self.pid if pid == -1 else pid, ref_name)

    def actor_status(self, actor_id: int, status: str, reason: str | None = None) -> None:
        if self.on:
            self._status(self.new_id(), now_us(), actor_id, status, reason, self.host)

    def message(self, msg_id: int, queued_us: int, active_us: int, done_us: int, from_actor: int, to_actor: int,
                endpoint: str, port_index: int | None, ok: bool) -> None:
        """A message handled (hot path: one append)."""
        self._msgs(msg_id, queued_us, active_us, done_us, from_actor, to_actor, endpoint, port_index, self.host,
                   "complete" if ok else "failed")

    def sent(self, sender_actor: int, mesh_id: int, view_json: str, shape_json_: str, endpoint: str,
             adverb: str, num_targets: int) -> None:
        """A message cast to an actor mesh (hot path: one append)."""
        self._sent(next(self._ids), _time_ns() // 1000, sender_actor, mesh_id, view_json, shape_json_, self.host,
                   endpoint, adverb, num_targets)

    def log_line(self, stream: str, line: str, *, run_id: str | None = None, rank: int | None = None,
                 proc: str | None = None) -> None:
        if self.on:
            self._logs(now_us(), self.host, run_id, rank, proc, stream, line)

    def span(self, start_us: int, actor: str, name: str, duration_us: int, error: str | None = None) -> None:
        if self.on:
            self.buffers["user_spans"].append(start_us, self.host, self.pid, actor, name, duration_us, error,
                                              self.new_id())

    def metric(self, actor: str, name: str, kind: str, value: float, attributes: str | None = None) -> None:
        if self.on:
            self.buffers["metrics"].append(now_us(), self.host, self.pid, actor, name, kind, float(value), attributes)

    # -- handing rows on ---------------------------------------------------------------

    def take(self) -> dict[str, tuple[int, list]]:
        """Everything recorded since the last take: {table: (rows, columns)}."""
        out = {}
        for name, buf in self.buffers.items():
            taken = buf.take()
            if taken is not None:
                out[name] = taken
        return out

    def start_flusher(self, send: Callable[[dict], None], interval_s: float = FLUSH_INTERVAL_S) -> None:
        """Call ``send(self.take())`` every ``interval_s`` while there is something to send."""
        if not self.on or self._flusher is not None:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                self.flush(send)

        self._flusher = threading.Thread(target=loop, name="telemetry-flush", daemon=True)
        self._flusher.start()

    def flush(self, send: Callable[[dict], None]) -> None:
        taken = self.take()
        if taken:
            try:
                send(taken)
            except Exception as e:  # the host agent is gone: these rows have nowhere to go
                log.debug("telemetry rows dropped: %s", e)

    def stop(self, deadline: float | None = None) -> None:
        """Stop the flusher; with a ``deadline`` (``time.monotonic()``), wait for it until then."""
        self._stop.set()
        t = self._flusher
        if deadline is not None and t is not None and t is not threading.current_thread():
            t.join(timeout=max(0.0, deadline - time.monotonic()))


def shape_json(labels: tuple, sizes: tuple) -> str:
    """A mesh's extent as Monarch serializes one: ``{"inner": {"labels": [...], "sizes": [...]}}``."""
    return json.dumps({"inner": {"labels": list(labels), "sizes": list(sizes)}}, separators=(",", ":"))


def region_json(labels: Sequence[str], sizes: Sequence[int], indices: Sequence[int] | None = None) -> str:
    """Ranks ``indices`` (row-major over ``sizes``; None: all of them) of a mesh's members as Monarch
    serializes a region: ``{"labels": [...], "slice": {"offset": o, "sizes": [...], "strides": [...]}}``.
    Ranks that are no strided grid (a selection of a selection) also carry ``"ranks": [...]``."""
    sizes = list(sizes)
    unit = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        unit[i] = unit[i + 1] * sizes[i + 1]
    d: dict = {"labels": list(labels)}
    if not indices:
        d["slice"] = {"offset": 0, "sizes": sizes, "strides": unit}
        return json.dumps(d, separators=(",", ":"))
    # A dimension of size 1 has no step to measure: it gets its row-major stride.
    strides = [indices[u] - indices[0] if n > 1 else u for n, u in zip(sizes, unit)]
    d["slice"] = {"offset": indices[0], "sizes": sizes, "strides": strides}
    if not _lists(indices[0], sizes, strides, indices):
        d["ranks"] = list(indices)
    return json.dumps(d, separators=(",", ":"))


def _lists(offset: int, sizes: list, strides: list, indices: Sequence[int]) -> bool:
    """Whether offset/sizes/strides, walked row-major, give exactly ``indices``."""
    got = [offset]
    for n, st in zip(sizes, strides):
        got = [g + k * st for g in got for k in range(n)]
    return got == list(indices)


def _hostname() -> str:
    import socket

    return socket.gethostname()


_recorder: Recorder | None = None
_lock = threading.Lock()


def recorder() -> Recorder:
    """This process's recorder (made on first use)."""
    global _recorder
    r = _recorder
    if r is None:
        with _lock:
            if _recorder is None:
                _recorder = Recorder()
            r = _recorder
    return r


def install(r: Recorder) -> Recorder:
    """Make ``r`` this process's recorder (a proc agent makes its own with its host's name)."""
    global _recorder
    with _lock:
        _recorder = r
    return r


class LineTee:
    """A text stream that writes through to ``stream`` and records each complete line as a log row."""

    def __init__(self, stream: Any, name: str, rec: Recorder, proc: str):
        self._stream = stream
        self._name = name
        self._rec = rec
        self._proc = proc
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        n = self._stream.write(s)
        if s:
            with self._lock:
                text = self._partial + s
                *lines, self._partial = text.split("\n")
                if len(self._partial) > 65536:  # a line that never ends is still recorded, in pieces
                    lines.append(self._partial)
                    self._partial = ""
            for line in lines:
                self._rec.log_line(self._name, line, proc=self._proc)
        return n

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tee_stdio(rec: Recorder, proc: str) -> None:
    """Record what Python code in this process prints (output still goes where it went)."""
    if rec.on:
        sys.stdout = LineTee(sys.stdout, "stdout", rec, proc)
        sys.stderr = LineTee(sys.stderr, "stderr", rec, proc)


def derive_messages(rows: int, columns: list) -> tuple[Any, Any]:
    """``messages`` and ``message_status_events`` batches from ``_message_log`` columns (needs pyarrow)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from monarch_telemetry.table import column_to_arrow

    names = [c.name for c in MESSAGE_LOG.columns]
    col = {n: column_to_arrow(c, t.arrow_type) for n, c, t in zip(names, columns, MESSAGE_LOG.columns)}
    ts = TABLES["messages_ext"].schema
    msgs = pa.RecordBatch.from_arrays([
        col["id"], col["active_us"], col["from_actor_id"], col["to_actor_id"], col["endpoint"], col["port_index"],
        col["host"], col["status"], pc.subtract(col["done_us"], col["queued_us"]),
        pc.subtract(col["active_us"], col["queued_us"]),
    ], schema=ts)
    # Event ids: the message id times 4 plus the step, unique because message ids stay under 2**61.
    ids = col["id"]
    four = pa.scalar(4, pa.int64())
    parts = []
    for step, (ts_col, status) in enumerate((("queued_us", "queued"), ("active_us", "active"), ("done_us", None))):
        parts.append(pa.RecordBatch.from_arrays([
            pc.add(pc.multiply(ids, four), pa.scalar(step, pa.int64())), col[ts_col], ids,
            col["status"] if status is None else pa.array([status] * rows, pa.string()), col["host"],
        ], schema=TABLES["message_status_events_ext"].schema))
    events = pa.Table.from_batches(parts).combine_chunks().to_batches()[0]
    return msgs, events
