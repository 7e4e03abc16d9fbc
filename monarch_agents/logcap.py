"""A rank's log kept under a size cap: its head and its tail, the middle left out and said so.

A runaway rank once wrote 60 GB of log and filled its host's disk.  So a rank's log (its
``<rank>.stdout``, ``.stderr`` and ``.order``, the format of ``monarch_agents.services.runs``) takes
at most ``MONARCH_RUN_LOG_MAX`` bytes (default 256 MiB; ``512M``, ``2G``, ``1048576``; ``0``: no cap),
read from the rank's environment (``monarch run -e MONARCH_RUN_LOG_MAX=1G``) or else its host
agent's.  The first half of the cap is written as it comes (the head); after that the output goes
to rotating tail files (``<rank>.tail<n>``, a quarter of the cap each, two at most: the older one
is removed when the newer is full), and when the rank ends a one-line note on its stderr (how much
was left out) and the tail are appended to the log, so a reader sees head, note, tail, in order.
While the tail is being kept, ``monarch logs -f`` follows the tail files (``<rank>.tails`` says
which there are), then shows the note and only what it had not shown of the tail.  At most about
1.25 times the cap is on disk at once (while the tail is appended).

What it does not change: the live stream to the client gets every byte; only what is kept is cut.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import Mapping

from monarch_agents.files import write_atomic

#: The environment variable of the cap (bytes, or a size such as ``256M``).
LOG_MAX_ENV = "MONARCH_RUN_LOG_MAX"
DEFAULT_LOG_MAX = 256 << 20
#: One record of ``<rank>.order``: b"o" (stdout) or b"e" (stderr), then the chunk's length.
ORDER_RECORD = struct.Struct("<cI")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
#: The file kind (``<rank>.tails``) that indexes a rank's tail files while its log is cut (see :class:`CappedLog`).
TAILS_KIND = "tails"
#: How much of a tail file is read at once when it is appended to the log.
_COPY = 1 << 20


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``1048576``, ``512K``, ``256M``, ``2G`` (powers of 1024); ValueError otherwise."""
    t = text.strip().lower()
    num = t.rstrip("kmgtib")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (e.g. 256M, 2G, or bytes)") from None
    if unit not in _UNITS or value < 0 or value != value:
        raise ValueError(f"{text!r} is not a size (e.g. 256M, 2G, or bytes)")
    return int(value * _UNITS[unit])


def log_cap(*envs: Mapping[str, str]) -> tuple[int, str]:
    """The cap from the first of ``envs`` that sets it, and '' or why that value was not taken
    (then the default applies: a typo never leaves a rank's log without a cap)."""
    for env in envs:
        text = env.get(LOG_MAX_ENV)
        if text:
            try:
                return parse_size(text), ""
            except ValueError as e:
                return DEFAULT_LOG_MAX, f"{LOG_MAX_ENV}: {e}; kept {human(DEFAULT_LOG_MAX)}"
    return DEFAULT_LOG_MAX, ""


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


@dataclass
class _Seg:
    """One tail file: ``<base>.tail<seq>``, records as in ``<rank>.order`` each followed by its bytes."""

    fd: int
    path: str
    seq: int
    size: int = 0  # bytes in it (records and output)
    records: int = 0
    out: dict = field(default_factory=lambda: {"stdout": 0, "stderr": 0})  # output bytes of each stream

    @property
    def output(self) -> int:
        return self.out["stdout"] + self.out["stderr"]


class CappedLog:
    """The log files of one rank at ``base`` (``<dir>/<rank>``), kept under ``cap`` bytes (0: none).

    While the tail is kept, ``<base>.tails`` (:data:`TAILS_KIND`, JSON, replaced whole) says which
    tail files are there (``<base>.tail<seq>``, ``seq`` counting up: a name is never reused, so a
    reader that follows one never reads another's bytes) and how much was left out; at close it
    says where the copied tail lies in the log's files, so ``monarch logs -f``, which showed the
    tail as it came, shows only what it had not (see ``monarch._workbench.logs.LogReader``).

    :meth:`write` and :meth:`close` raise ``OSError`` (a full disk): the caller stops writing then."""

    def __init__(self, base: str, cap: int):
        self.base = base
        self.cap = cap
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        self.fds: dict[str, int] = {}
        try:
            for s in ("stdout", "stderr", "order"):
                self.fds[s] = os.open(f"{base}.{s}", flags, 0o600)
        except OSError:
            self._close_fds()
            raise
        #: Bytes (output and order records) the head may still take.
        self.head_left = cap // 2
        self.seg_max = max(cap // 4, 1)
        #: The tail files, oldest first (two at most).
        self.segs: list[_Seg] = []
        self.next_seq = 0
        #: Output bytes left out (neither in the head nor in the tail).
        self.dropped = 0
        self.head_bytes = 0

    @property
    def truncated(self) -> bool:
        return bool(self.segs)

    def write(self, stream: str, data: bytes) -> None:
        tag = b"o" if stream == "stdout" else b"e"
        if not self.cap:
            self._append(tag, data)
            return
        if not self.segs:
            room = self.head_left - ORDER_RECORD.size
            if room > 0:
                part = data[:room]
                self._append(tag, part)
                self.head_left -= len(part) + ORDER_RECORD.size
                self.head_bytes += len(part)
                data = data[room:]
            if not data:
                return
        self._tail(tag, data)

    def _append(self, tag: bytes, data: bytes) -> None:
        _write_all(self.fds["stdout" if tag == b"o" else "stderr"], data)
        _write_all(self.fds["order"], ORDER_RECORD.pack(tag, len(data)))

    def _tail(self, tag: bytes, data: bytes) -> None:
        keep = self.seg_max - ORDER_RECORD.size
        if len(data) > keep:  # one chunk bigger than a tail file: its end is what a tail keeps
            self.dropped += len(data) - max(keep, 0)
            data = data[len(data) - max(keep, 0):]
        if not self.segs or (self.segs[-1].size and self.segs[-1].size + ORDER_RECORD.size + len(data) > self.seg_max):
            self._rotate()
        seg = self.segs[-1]
        _write_all(seg.fd, ORDER_RECORD.pack(tag, len(data)) + data)
        seg.size += ORDER_RECORD.size + len(data)
        seg.records += 1
        seg.out["stdout" if tag == b"o" else "stderr"] += len(data)

    def _rotate(self) -> None:
        if len(self.segs) == 2:
            oldest = self.segs.pop(0)
            self.dropped += oldest.output
            os.close(oldest.fd)
            os.unlink(oldest.path)  # before the next is made: at most two on disk
        path = f"{self.base}.tail{self.next_seq}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self.segs.append(_Seg(fd, path, self.next_seq))
        self.next_seq += 1
        self._write_tails({"closed": False, "segs": [s.seq for s in self.segs], "dropped": self.dropped})

    def _write_tails(self, index: dict) -> None:
        """``<base>.tails``: for a reader only, so one that cannot be written costs the log nothing
        (a follower then sees the tail at the end, as before there was an index)."""
        try:
            write_atomic(f"{self.base}.{TAILS_KIND}", json.dumps(index).encode(), durable=False)
        except OSError:
            pass

    def note(self) -> str:
        """The line that says what was left out, '' if nothing was."""
        if not self.segs:
            return ""
        tail = sum(s.output for s in self.segs)
        return (f"its log was cut at {human(self.cap)} ({LOG_MAX_ENV}): kept the first {human(self.head_bytes)} "
                f"and the last {human(tail)}, left out {human(self.dropped)} between them "
                f"({self.base}.stdout, .stderr)")

    def close(self) -> None:
        """Append the note and the tail (if the cap was reached), remove the tail files, close."""
        try:
            if self.segs:
                marker = f"\n[monarch: {self.note()}]\n".encode()
                head = {s: os.fstat(fd).st_size for s, fd in self.fds.items()}
                # Where each file's head ends, where the note ends, and what each tail file adds:
                # written before the log grows, so a reader that sees it grown finds it.
                self._write_tails({"closed": True, "head": head, "marker": len(marker),
                                   "segs": [[s.seq, s.records, s.out["stdout"], s.out["stderr"]] for s in self.segs]})
                self._append(b"e", marker)
                for seg in self.segs:
                    self._copy_tail(seg.path)
                    os.close(seg.fd)
                    seg.fd = -1
                    os.unlink(seg.path)  # before the next is copied: the disk holds one tail file less
        finally:
            for seg in self.segs:
                if seg.fd >= 0:
                    os.close(seg.fd)
                    seg.fd = -1
                try:
                    os.unlink(seg.path)
                except FileNotFoundError:
                    pass
            self._close_fds()

    def _copy_tail(self, path: str) -> None:
        with open(path, "rb") as f:
            while True:
                head = f.read(ORDER_RECORD.size)
                if len(head) < ORDER_RECORD.size:
                    return
                tag, length = ORDER_RECORD.unpack(head)
                out = self.fds["stdout" if tag == b"o" else "stderr"]
                left = length
                while left:
                    piece = f.read(min(left, _COPY))
                    if not piece:
                        raise OSError(f"tail file of {self.base} ended early")
                    _write_all(out, piece)
                    left -= len(piece)
                _write_all(self.fds["order"], head)

    def _close_fds(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class CappedFile:
    """One log file (a proc's stdout and stderr together) kept under ``cap`` bytes (0: none), as
    :class:`CappedLog` keeps a rank's: the head as it comes, then two rotating tail files
    (``<path>.tail0``/``.tail1``), appended after a one-line note when it is closed."""

    def __init__(self, path: str, cap: int):
        self.path = path
        self.cap = cap
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        # What an earlier proc of the same name left counts against this one's head.
        self.head_left = cap // 2 - os.fstat(self.fd).st_size if cap else 0
        self.head_bytes = 0
        self.seg_max = max(cap // 4, 1)
        self.segs: list[list] = []  # [fd, bytes in it, path], oldest first
        self.dropped = 0

    @property
    def truncated(self) -> bool:
        return bool(self.segs)

    def write(self, data: bytes) -> None:
        if not self.cap:
            _write_all(self.fd, data)
            return
        if not self.segs and self.head_left > 0:
            part = data[:self.head_left]
            _write_all(self.fd, part)
            self.head_left -= len(part)
            self.head_bytes += len(part)
            data = data[len(part):]
        if not data:
            return
        if len(data) > self.seg_max:
            self.dropped += len(data) - self.seg_max
            data = data[len(data) - self.seg_max:]
        if not self.segs or self.segs[-1][1] + len(data) > self.seg_max:
            self._rotate()
        _write_all(self.segs[-1][0], data)
        self.segs[-1][1] += len(data)

    def _rotate(self) -> None:
        if len(self.segs) < 2:
            path = f"{self.path}.tail{len(self.segs)}"
            self.segs.append([os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600), 0, path])
            return
        oldest = self.segs.pop(0)
        self.dropped += oldest[1]
        os.ftruncate(oldest[0], 0)
        oldest[1] = 0
        self.segs.append(oldest)

    def note(self) -> str:
        if not self.segs:
            return ""
        return (f"this log was cut at {human(self.cap)} ({LOG_MAX_ENV}): kept the first {human(self.head_bytes)} "
                f"and the last {human(sum(s[1] for s in self.segs))}, left out {human(self.dropped)} between them")

    def close(self) -> None:
        try:
            if self.segs:
                _write_all(self.fd, f"\n[monarch: {self.note()}]\n".encode())
                for seg in self.segs:
                    with os.fdopen(os.dup(seg[0]), "rb") as f:
                        f.seek(0)
                        while piece := f.read(_COPY):
                            _write_all(self.fd, piece)
                    os.close(seg[0])
                    seg[0] = -1
                    os.unlink(seg[2])
        finally:
            for seg in self.segs:
                if seg[0] >= 0:
                    os.close(seg[0])
                try:
                    os.unlink(seg[2])
                except FileNotFoundError:
                    pass
            os.close(self.fd)


class LogPump:
    """One thread (``proc-logs``) that reads the output pipes of many children into capped files: a
    proc's output goes to a pipe instead of straight to its log file, so its file has a cap too.
    Each pipe ends when its child and everything it started closed it; :meth:`stop` joins the thread."""

    def __init__(self, cap: int):
        import selectors
        import threading

        self.cap = cap
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.pending: list[tuple[int, str]] = []
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="proc-logs", daemon=True)
        self.thread.start()

    def add(self, path: str) -> int:
        """A pipe's write end (the caller passes it on and closes it) whose bytes go to ``path``,
        under the cap.  OSError when the file or the pipe cannot be made."""
        r, w = os.pipe()
        with self.lock:
            self.pending.append((r, path))
        self._wake()
        return w

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass  # woken already (the pipe is full), or stopped

    def _run(self) -> None:
        import logging
        import selectors

        log = logging.getLogger("monarch.host_agent")
        files: dict[int, CappedFile | None] = {}
        try:
            while True:
                for key, _ in self.sel.select():
                    if key.data is None:
                        os.read(self.wake_r, 4096)
                        continue
                    fd = key.fd
                    data = os.read(fd, 65536)
                    out = files.get(fd)
                    if not data:
                        self.sel.unregister(fd)
                        os.close(fd)
                        files.pop(fd, None)
                        self._close(out, log)
                        continue
                    if out is None:
                        continue  # its file could not be written: the output is dropped, the child runs on
                    was = out.truncated
                    try:
                        out.write(data)
                    except OSError as e:
                        log.warning("%s: %s; the rest of this proc's output is dropped", out.path, e.strerror or e)
                        files[fd] = None
                        self._close(out, log)
                        continue
                    if out.truncated and not was:
                        log.warning("%s reached its cap of %s: keeping its tail only from here", out.path,
                                    human(out.cap))
                with self.lock:
                    pending, self.pending = self.pending, []
                    stopping = self.stopping
                for r, path in pending:
                    try:
                        files[r] = CappedFile(path, self.cap)
                    except OSError as e:
                        log.warning("%s: %s; this proc's output is dropped", path, e.strerror or e)
                        files[r] = None
                    self.sel.register(r, selectors.EVENT_READ, path)
                if stopping and not pending:
                    return
        finally:
            for fd, out in files.items():
                self._drain(fd, out)
                self._close(out, log)
                try:
                    self.sel.unregister(fd)
                except (KeyError, ValueError):
                    pass
                os.close(fd)
            self.sel.close()

    @staticmethod
    def _drain(fd: int, out: "CappedFile | None") -> None:
        """What is still in the pipe at stop (bounded: a child still writing cannot hold the stop)."""
        os.set_blocking(fd, False)
        for _ in range(64):
            try:
                data = os.read(fd, 65536)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            if out is not None:
                try:
                    out.write(data)
                except OSError:
                    return

    @staticmethod
    def _close(out: "CappedFile | None", log) -> None:
        if out is None:
            return
        try:
            out.close()
        except OSError as e:
            log.warning("%s: %s", out.path, e.strerror or e)

    def stop(self, deadline: float) -> bool:
        """Read what is left, close every file (tails appended) and join the thread by ``deadline``
        (``time.monotonic()``); the children should be gone already.  True if it ended."""
        import time

        with self.lock:
            if self.wake_w < 0:
                return True  # stopped already
            self.stopping = True
        self._wake()
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.thread.is_alive():
            return False
        with self.lock:
            fds, self.wake_r, self.wake_w = (self.wake_r, self.wake_w), -1, -1
        for fd in fds:
            os.close(fd)
        return True


#: The environment variable of the cap of a host agent's own log (its stdout and stderr: ``agent.log``).
AGENT_LOG_MAX_ENV = "MONARCH_AGENT_LOG_MAX"
DEFAULT_AGENT_LOG_MAX = 32 << 20


class StdioLogCap:
    """Keeps the file this process's stderr (and stdout, if the same file) is, ``agent.log``, under
    ``cap`` bytes: once it reaches it, it becomes ``<path>.1`` (replacing the one before) and a new
    ``<path>`` starts with a line saying so.  So the newest lines, the ones an error report needs,
    are always there (at least ``cap`` bytes' worth), and at most about twice the cap is on disk.

    Checked before each record the process logs (a ``logging`` filter: an ``fstat``), the only
    writer that can run away.  What children forked before a rotation write goes on into
    ``<path>.1``; they write little (the zygote)."""

    def __init__(self, path: str, cap: int, fds: list[int]):
        import threading

        self.path = path
        self.cap = cap
        self.fds = fds
        self.lock = threading.Lock()

    @classmethod
    def install(cls, env: Mapping[str, str]) -> "StdioLogCap | None":
        """The cap on this process's stderr file, checked before every record the root logger's
        handlers write; None when stderr is not a file of ours to rotate (a terminal, a pipe), or
        the cap is 0.  A bad ``MONARCH_AGENT_LOG_MAX`` is said in the log, and the default applies."""
        import logging
        import stat

        problem = ""
        try:
            cap = parse_size(env.get(AGENT_LOG_MAX_ENV) or str(DEFAULT_AGENT_LOG_MAX))
        except ValueError as e:
            cap, problem = DEFAULT_AGENT_LOG_MAX, f"{AGENT_LOG_MAX_ENV}: {e}; kept {human(DEFAULT_AGENT_LOG_MAX)}"
        try:
            st = os.fstat(2)
            path = os.readlink("/proc/self/fd/2")
            named = os.stat(path)
        except OSError:
            return None
        if problem:
            logging.getLogger("monarch.host_agent").warning("%s", problem)
        if not cap or not stat.S_ISREG(st.st_mode) or (named.st_dev, named.st_ino) != (st.st_dev, st.st_ino):
            return None
        fds = [2]
        try:
            out = os.fstat(1)
            if (out.st_dev, out.st_ino) == (st.st_dev, st.st_ino):
                fds.insert(0, 1)
        except OSError:
            pass
        capper = cls(path, cap, fds)
        for handler in logging.getLogger().handlers:
            handler.addFilter(capper)
        capper.check()  # an agent started again on the same host appends to the last one's file
        return capper

    def filter(self, record: object) -> bool:
        self.check()
        return True

    def check(self) -> None:
        if not self.cap or os.fstat(2).st_size < self.cap:
            return
        import time

        with self.lock:
            try:
                if os.fstat(2).st_size < self.cap:
                    return  # another thread rotated it
                os.replace(self.path, self.path + ".1")
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError:
                self.cap = 0  # cannot rotate here (the folder went read-only, say): the log goes on as it was
                return
            try:
                note = (f"[monarch: {time.strftime('%Y-%m-%d %H:%M:%S')} this log reached its cap of {human(self.cap)} "
                        f"({AGENT_LOG_MAX_ENV}): the lines before this one are in {os.path.basename(self.path)}.1, "
                        "older ones were removed]\n")
                try:
                    _write_all(fd, note.encode())
                except OSError:
                    pass  # a full disk: the lines that follow are what matters
                for target in self.fds:
                    os.dup2(fd, target)
            finally:
                os.close(fd)
