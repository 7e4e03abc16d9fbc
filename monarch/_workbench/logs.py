"""A run's output, read back whole: the engine behind ``monarch logs``.

Every rank's output is kept where it ran, in three files per rank (the host agent's format, see
``monarch_agents.services.runs``): ``<rank>.stdout`` and ``<rank>.stderr`` byte for byte, and
``<rank>.order``, which says in which order chunks of the two came; ``<rank>.exit`` appears once
the rank has ended and nothing more will be written.  Command runs keep them on their host
agents (read through ``ReadLog``, any size, in bounded pieces); actor programs run by
``monarch run prog.py`` keep them in the job folder on this machine (:class:`ProgramLog`).

:class:`LogReader` turns them back into chunks, in the order a terminal showed them, and, with
``follow``, keeps going until every rank has ended without losing a byte.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from monarch_agents.files import private_dir, write_atomic
from monarch_agents.logcap import CappedLog, log_cap
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
