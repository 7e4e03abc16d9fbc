"""A run's output, read back whole: the engine behind ``monarch logs``.

Every rank's output is kept where it ran, in three files per rank (the host agent's format, see
``monarch_agents.services.runs``): ``<rank>.stdout`` and ``<rank>.stderr`` byte for byte, and
``<rank>.order``, which says in which order chunks of the two came; ``<rank>.exit`` appears once
the rank has ended and nothing more will be written.  Command runs keep them on their host
agents (read through ``ReadLog``, any size, in bounded pieces); actor programs run by
``monarch run prog.py`` keep them in the job folder on this machine (:class:`ProgramLog`).

:class:`LogReader` turns them back into chunks, in the order a terminal showed them, and, with
``follow``, keeps going until every rank has ended without losing a byte.  A log cut at its cap
(``monarch_agents.logcap``) stops growing after its head: the reader then follows its tail files
as they are written (a note says how much was left out before them), and when the rank ends it
shows the log's note and only what it had not shown of the tail.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from monarch_agents.files import private_dir, write_atomic
from monarch_agents.logcap import LOG_MAX_ENV, TAILS_KIND, CappedLog, human, log_cap
from monarch_agents.services.runs import ORDER_RECORD, RankExit
from monarch._workbench.state import JobRecord

__all__ = ["Chunk", "LogReader", "ProgramLog", "RankExit", "STREAMS", "local_fetch", "program_run_dir"]

#: Both streams, in the order chunks came; or one of them.
STREAMS = ("stdout", "stderr")

#: (rank, file kind, offset) -> (bytes from offset, whether the rank had ended before they were read)
Fetch = Callable[[int, str, int], tuple[bytes, bool]]


@dataclass
class Chunk:
    rank: int
    stream: str
    data: bytes


@dataclass
class _Rank:
    rank: int
    offsets: dict = field(default_factory=lambda: {"order": 0, "stdout": 0, "stderr": 0})
    order_tail: bytes = b""
    pending: list = field(default_factory=list)  # [(stream, length)] whose bytes are not yet read
    buffered: dict = field(default_factory=lambda: {"stdout": b"", "stderr": b""})
    seen_order: bool = False
    done: bool = False
    #: The tail file being followed (``<rank>.tail<seq>``) while the log is cut at its cap; None: the head.
    tail_seq: int | None = None
    tail_off: int = 0  # bytes of it read
    tail_buf: bytes = b""  # the start of a record not read whole yet
    tail_records: int = 0  # whole records of it read (shown, or not of a stream shown)
    tail_out: dict = field(default_factory=lambda: {"stdout": 0, "stderr": 0})  # their bytes, by stream


class LogReader:
    """Reads ranks' logs through ``fetch``; ``poll()`` returns what is new, in order."""

    def __init__(self, fetch: Fetch, ranks: list[int], streams: tuple[str, ...] = STREAMS):
        self.fetch = fetch
        self.streams = streams
        self.ranks = {r: _Rank(r) for r in ranks}

    @property
    def done(self) -> bool:
        return all(r.done for r in self.ranks.values())

    def poll(self) -> list[Chunk]:
        out: list[Chunk] = []
        for r in self.ranks.values():
            if not r.done:
                out.extend(self._poll_rank(r))
        return out

    def follow(self, interval_s: float = 0.25) -> Iterator[Chunk]:
        """Every chunk until every rank has ended."""
        while True:
            yield from self.poll()
            if self.done:
                return
            time.sleep(interval_s)

    def _read_all(self, r: _Rank, kind: str) -> tuple[bytes, bool]:
        """Everything in ``kind`` past our offset, and whether it is final (the rank had ended)."""
        parts = []
        while True:
            data, done = self.fetch(r.rank, kind, r.offsets[kind])
            r.offsets[kind] += len(data)
            parts.append(data)
            if not data:
                return b"".join(parts), done

    def _poll_rank(self, r: _Rank) -> list[Chunk]:
        if r.tail_seq is not None:
            return self._poll_tail(r)
        chunks = self._poll_head(r)
        if r.done or r.pending or r.order_tail:
            return chunks
        return chunks + self._enter_tail(r)

    # -- a log cut at its cap: its tail files, while the rank runs --------------------------------

    def _index(self, r: _Rank) -> dict | None:
        """The log's ``<rank>.tails`` (which tail files there are; where the tail went at close), or None."""
        parts = []
        while True:
            data, _ = self.fetch(r.rank, TAILS_KIND, sum(map(len, parts)))
            if not data:
                break
            parts.append(data)
        try:
            index = json.loads(b"".join(parts)) if parts else None
        except ValueError:
            return None  # not one of ours: the log is read as if it had none
        return index if isinstance(index, dict) else None

    def _note(self, r: _Rank, text: str) -> list[Chunk]:
        """A line of ours, on stderr (where the log's own note is), when stderr is shown."""
        return [Chunk(r.rank, "stderr", f"\n[monarch: {text}]\n".encode())] if "stderr" in self.streams else []

    def _enter_tail(self, r: _Rank) -> list[Chunk]:
        """The head has nothing new: if the log went on in its tail files, follow them from the oldest."""
        index = self._index(r)
        if index is None or index.get("closed"):
            return []  # not cut, or cut and closed: the rest comes through the head (note and tail)
        # Tail files are made only once the head is full: what is left of the head is all of it.
        chunks = self._poll_head(r)
        index = self._index(r)
        if r.done or r.pending or r.order_tail or index is None or index.get("closed") or not index.get("segs"):
            return chunks  # it ended meanwhile: its note and tail come through the head
        r.tail_seq, r.tail_off, r.tail_buf, r.tail_records = index["segs"][0], 0, b"", 0
        r.tail_out = {"stdout": 0, "stderr": 0}
        if index.get("dropped"):
            chunks += self._note(r, f"its log reached its cap ({LOG_MAX_ENV}): {human(index['dropped'])} left "
                                    "out here; following its tail")
        return chunks + self._poll_tail(r)

    def _read_tail(self, r: _Rank) -> tuple[list[Chunk], bool]:
        """What is new in the tail file followed, and whether the rank had ended before it was read."""
        chunks: list[Chunk] = []
        while True:
            data, done = self.fetch(r.rank, f"tail{r.tail_seq}", r.tail_off)
            if not data:
                return chunks, done
            r.tail_off += len(data)
            buf, pos = r.tail_buf + data, 0
            while len(buf) - pos >= ORDER_RECORD.size:
                tag, length = ORDER_RECORD.unpack_from(buf, pos)
                if len(buf) - pos - ORDER_RECORD.size < length:
                    break
                stream = "stdout" if tag == b"o" else "stderr"
                start = pos + ORDER_RECORD.size
                pos = start + length
                r.tail_records += 1
                r.tail_out[stream] += length
                if stream in self.streams and length:
                    chunks.append(Chunk(r.rank, stream, buf[start:pos]))
            r.tail_buf = buf[pos:]

    def _poll_tail(self, r: _Rank) -> list[Chunk]:
        chunks, done = self._read_tail(r)
        index = self._index(r)
        if index is not None and index.get("closed"):
            return chunks + self._finish_tail(r, index)
        segs = (index or {}).get("segs") or []
        if segs and segs[-1] != r.tail_seq:
            # The rank writes to a newer tail file: this one is whole now; its last bytes, then the next.
            more, _ = self._read_tail(r)
            more = chunks + more
            nxt = r.tail_seq + 1
            if nxt not in segs:  # this reader fell behind by a whole tail file: that output is gone
                nxt = segs[0]
                more += self._note(r, "its log's tail moved on faster than it was read: some output left out here")
            r.tail_seq, r.tail_off, r.tail_buf, r.tail_records = nxt, 0, b"", 0
            r.tail_out = {"stdout": 0, "stderr": 0}
            return more + self._poll_tail(r)
        if chunks:
            return chunks
        # Quiet, or ended: the log grows past its head only at the end (a closed index is written first).
        kind = "order" if len(self.streams) > 1 else self.streams[0]
        grown, ended = self.fetch(r.rank, kind, r.offsets[kind])
        if not grown and not ended and not done:
            return []
        index = self._index(r)
        if index is not None and index.get("closed"):
            return self._finish_tail(r, index)
        # Ended without saying where its tail went (its index could not be written): the head's
        # reader shows the note and the whole tail (some of it again), nothing lost.
        r.tail_seq = None
        return self._poll_head(r)

    def _finish_tail(self, r: _Rank, index: dict) -> list[Chunk]:
        """The rank ended: its log is head, note, tail.  Show the note, then read on from the first
        byte of the tail this reader had not read (the tail files were copied in order)."""
        try:
            head = {k: int(index["head"][k]) for k in ("order", "stdout", "stderr")}
            marker = int(index["marker"])
            segs = [(int(a), int(b), int(c), int(d)) for a, b, c, d in index["segs"]]
        except (KeyError, TypeError, ValueError):
            r.tail_seq = None  # not an index we can read: the whole tail again, nothing lost
            return self._poll_head(r)
        note, _ = self.fetch(r.rank, "stderr", head["stderr"])
        if len(note) < marker:
            return []  # being written: the next poll
        records, out = 0, {"stdout": 0, "stderr": 0}
        chunks: list[Chunk] = []
        if segs and r.tail_seq < segs[0][0]:
            chunks += self._note(r, "its log's tail moved on faster than it was read: some output left out here")
        for seq, recs, o, e in segs:
            if seq < r.tail_seq:
                records, out["stdout"], out["stderr"] = records + recs, out["stdout"] + o, out["stderr"] + e
            elif seq == r.tail_seq:
                records += r.tail_records
                out = {s: out[s] + r.tail_out[s] for s in out}
        if "stderr" in self.streams:
            chunks.insert(0, Chunk(r.rank, "stderr", note[:marker]))
        r.offsets = {"order": head["order"] + ORDER_RECORD.size * (1 + records), "stdout": head["stdout"] + out["stdout"],
                     "stderr": head["stderr"] + marker + out["stderr"]}
        r.order_tail, r.pending, r.buffered = b"", [], {"stdout": b"", "stderr": b""}
        r.seen_order, r.tail_seq = True, None
        return chunks + self._poll_head(r)

    # -- the log's files -------------------------------------------------------------------------

    def _poll_head(self, r: _Rank) -> list[Chunk]:
        if len(self.streams) == 1:
            # One stream: its file is the answer, no ordering needed.
            data, done = self._read_all(r, self.streams[0])
            r.done = done
            return [Chunk(r.rank, self.streams[0], data)] if data else []
        data, done = self._read_all(r, "order")
        buf = r.order_tail + data
        usable = len(buf) - len(buf) % ORDER_RECORD.size
        r.order_tail = buf[usable:]
        for off in range(0, usable, ORDER_RECORD.size):
            tag, length = ORDER_RECORD.unpack_from(buf, off)
            r.pending.append(("stdout" if tag == b"o" else "stderr", length))
        r.seen_order |= usable > 0
        if done and not r.seen_order:
            # Written without an order file (an older agent): stdout, then stderr.
            chunks = []
            for s in STREAMS:
                d, _ = self._read_all(r, s)
                if d:
                    chunks.append(Chunk(r.rank, s, d))
            r.done = True
            return chunks
        need = {s: sum(n for st, n in r.pending if st == s) - len(r.buffered[s]) for s in STREAMS}
        for s in STREAMS:
            while need[s] > 0:
                d, _ = self.fetch(r.rank, s, r.offsets[s])
                if not d:
                    break  # recorded in the order file but not readable: keep it for the next poll
                r.offsets[s] += len(d)
                r.buffered[s] += d
                need[s] -= len(d)
        chunks = []
        while r.pending:
            s, n = r.pending[0]
            if len(r.buffered[s]) < n:
                break
            chunks.append(Chunk(r.rank, s, r.buffered[s][:n]))
            r.buffered[s] = r.buffered[s][n:]
            r.pending.pop(0)
        r.done = done and not r.pending
        return chunks


def local_fetch(run_dir: str) -> Fetch:
    """Reads logs kept in ``run_dir`` on this machine (an actor program's)."""

    def fetch(rank: int, kind: str, offset: int) -> tuple[bytes, bool]:
        done = os.path.exists(os.path.join(run_dir, f"{rank}.exit"))
        try:
            with open(os.path.join(run_dir, f"{rank}.{kind}"), "rb") as f:
                f.seek(offset)
                return f.read(4 << 20), done
        except FileNotFoundError:
            return b"", done

    return fetch


def program_run_dir(record: JobRecord, run_id: str) -> str:
    return os.path.join(record.job_dir, "runs", os.path.basename(run_id))


class ProgramLog:
    """Keeps an actor program's output as a host agent keeps a rank's (rank 0, in the job folder),
    under the same cap (``MONARCH_RUN_LOG_MAX``, ``monarch_agents.logcap``)."""

    def __init__(self, record: JobRecord, run_id: str, env: Mapping[str, str] | None = None):
        self.dir = program_run_dir(record, run_id)
        #: Why the log is incomplete ('' while it is whole): a full disk stops the log, never the program.
        self.error = ""
        self.log: CappedLog | None = None
        cap, self.problem = log_cap(env or {}, os.environ)
        try:
            private_dir(self.dir, top=record.job_dir)
            self.log = CappedLog(os.path.join(self.dir, "0"), cap)
        except OSError as e:
            self._fail(e)

    def write(self, stream: str, data: bytes) -> None:
        if self.log is None:
            return
        try:
            self.log.write(stream, data)
        except OSError as e:
            self._fail(e)

    def _fail(self, e: OSError) -> None:
        self.error = self.error or f"log is incomplete: {e.strerror or e} ({self.dir})"
        capped, self.log = self.log, None
        if capped is not None:
            try:
                capped.close()
            except OSError:
                pass  # the same full disk, flushing what it could not write: already said

    def close(self, exit_code: int, reason: str) -> None:
        capped, self.log = self.log, None
        if capped is not None:
            note = capped.note()
            try:
                capped.close()
                self.error = self.error or note.removeprefix("its ")
            except OSError as e:
                self._fail(e)
        if self.problem:
            self.error = "; ".join(x for x in (self.error, self.problem) if x)
        try:
            write_atomic(os.path.join(self.dir, "0.exit"), RankExit(exit_code, reason, time.time()).to_bytes(),
                         durable=False)
        except OSError as e:
            self._fail(e)
