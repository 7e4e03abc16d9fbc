"""Procs' stdout and stderr streamed to the client, as Monarch's ``ProcMesh.logging_option`` does.

With ``configure(enable_log_forwarding=True)``, ``logging_option()`` puts a forwarder in every proc
of the mesh: the proc's fds 1 and 2 become pipes that one thread of the proc reads, writing every
byte on to where they went before (its host's stdout/stderr, as always) and, while
``stream_to_client`` is on, sending each line, prefixed with the proc's rank (``[3] ...``), to this
client.  Here a ``LogClient`` (one per proc mesh) prints them on the client's own stdout/stderr as
they are now: each line as ``[host pid] line``, or, with ``aggregate_window_sec``, every window's
lines in groups of similar ones (normalized edit distance under 0.15), each group once as
``[N similar log lines] line`` between ``>>> Aggregated Logs (start) >>>`` and ``<<< ... <<<``.

``flush()`` is a barrier: each forwarder sends what its proc wrote so far, then a marker; when every
marker is in, the groups so far are printed.  ``ProcMesh.stop()`` flushes first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import select
import socket
import sys
import threading
import time
import warnings
from typing import Any

from monarch import config as _config
from monarch.actor._endpoint import endpoint
from monarch.actor._mesh import Actor, current_rank

log = logging.getLogger("monarch.actor")

#: Lines this similar (normalized edit distance below it) are one group of an aggregation window.
SIMILARITY = 0.15
#: How long a flush waits for every proc's marker (Monarch's: 3 s, best effort).
FLUSH_TIMEOUT_S = 3.0
#: Longest line sent to the client; longer ones are cut and say so.
MAX_LINE = 4096


# -- in each proc --------------------------------------------------------------------------------


class _Tee:
    """This proc's fds 1 and 2 through pipes, read by one thread: every byte goes on to the fd it
    went to before; complete lines also go to the client's port while streaming is on."""

    def __init__(self, rank: int):
        self.prefix = f"[{rank}] "
        self.host = os.environ.get("MONARCH_HOSTNAME") or socket.gethostname()
        self.lock = threading.Lock()
        self.port: Any = None
        self.stream = False
        self.pipes: dict[int, tuple[str, int, bytearray]] = {}  # read fd -> (target, original fd, partial line)
        #: Set once reading a line for the client failed: from then on the bytes are only passed on.
        self.failed = False
        for fd, target, pyfile in ((1, "stdout", sys.stdout), (2, "stderr", sys.stderr)):
            try:
                pyfile.flush()
            except (OSError, ValueError, AttributeError):
                pass
            original = os.dup(fd)
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            os.set_blocking(r, False)
            self.pipes[r] = (target, original, bytearray())
        threading.Thread(target=self._run, name="monarch-log-forward", daemon=True).start()

    def _run(self) -> None:
        # Never ends while a pipe is open: were it to, the proc's prints would block once a pipe's
        # 64 KiB filled.  poll, not select: select refuses descriptors from 1024 on.
        poller = select.poll()
        for r in self.pipes:
            poller.register(r, select.POLLIN)
        fds = set(self.pipes)
        while fds:
            try:
                ready = poller.poll()
            except InterruptedError:  # pragma: no cover - Python retries it itself
                continue
            with self.lock:
                for r, _ in ready:
                    if r in fds and not self._drain_guarded(r):
                        fds.discard(r)
                        poller.unregister(r)

    def _drain_guarded(self, r: int) -> bool:
        """:meth:`_drain`, or, once it has failed (said once, on the proc's own stderr), the bytes only
        passed on to where they went before: the proc's output keeps flowing either way."""
        if not self.failed:
            try:
                return self._drain(r)
            except Exception:  # noqa: BLE001 - any failure: the output must still drain
                self.failed = True
                self._say_failed()
        return _pass_on(r, self.pipes[r][1])

    def _say_failed(self) -> None:
        # To the original stderr itself: through logging it would go into the pipe this thread drains.
        import traceback

        originals = {target: fd for target, fd, _ in self.pipes.values()}
        text = ("monarch: forwarding this proc's output to the client failed; it still goes to its "
                f"stdout/stderr, no longer to the client:\n{traceback.format_exc()}")
        _write_all(originals.get("stderr", 2), text.encode("utf-8", "replace"))

    def _drain(self, r: int) -> bool:
        """Read what the pipe holds now; False once it is closed."""
        target, original, partial = self.pipes[r]
        lines: list[str] = []
        open_ = True
        while True:
            try:
                chunk = os.read(r, 65536)
            except BlockingIOError:
                break
            if not chunk:
                open_ = False
                break
            _write_all(original, chunk)
            partial += chunk
            *complete, rest = partial.split(b"\n")
            partial[:] = rest
            for raw in complete:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                if len(line) > MAX_LINE:
                    line = line[:MAX_LINE] + "... [TRUNCATED]"
                lines.append(self.prefix + line)
        if lines and self.stream and self.port is not None:
            self._send(("log", self.host, os.getpid(), target, lines))
        return open_

    def _send(self, value: Any) -> None:
        try:
            self.port.send(value)
        except Exception as e:  # noqa: BLE001 - the client may be gone: the bytes still went to the fds
            log.debug("forwarding proc output to the client: %s", e)

    def flush(self, version: int) -> None:
        """Send what was written so far, then the barrier's marker (in that order, on one port)."""
        for pyfile in (sys.stdout, sys.stderr):
            try:
                pyfile.flush()
            except (OSError, ValueError, AttributeError):
                pass
        with self.lock:
            for r in self.pipes:
                self._drain_guarded(r)
            if self.port is not None:
                self._send(("flush", version))


_tee: _Tee | None = None
_tee_lock = threading.Lock()


class _LogForwarder(Actor):
    """One per proc of a mesh whose logging options were set: its proc's half of streaming."""

    def __init__(self, port: Any) -> None:
        self.port = port

    @endpoint
    def set_mode(self, stream: bool, level: int) -> None:
        global _tee
        logging.getLogger().setLevel(level)
        if self.port is None:  # log forwarding is off: only the level applies
            return
        with _tee_lock:
            if _tee is None:
                _tee = _Tee(current_rank().rank)
            tee = _tee
        with tee.lock:
            tee.port, tee.stream = self.port, stream

    @endpoint
    def flush(self, version: int) -> None:
        if self.port is not None and _tee is not None:
            _tee.flush(version)


def _pass_on(r: int, original: int) -> bool:
    """What pipe ``r`` holds now, written to ``original`` as it is; False once the pipe is closed."""
    while True:
        try:
            chunk = os.read(r, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False  # not readable at all any more: nothing can drain it
        if not chunk:
            return False
        _write_all(original, chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            p = select.poll()  # not select: it refuses descriptors from 1024 on
            p.register(fd, select.POLLOUT)
            p.poll()
            continue
        except OSError:
            return  # where it went is gone (a closed terminal): nothing else to do with it
        view = view[n:]


# -- in the client -------------------------------------------------------------------------------


def _distance(a: str, b: str) -> float:
    """Levenshtein distance over the longer length (0 identical, 1 nothing alike)."""
    if a == b:
        return 0.0
    longest = max(len(a), len(b))
    if not a or not b:
        return 1.0
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1] / longest


class _Window:
    """One output's lines of one aggregation window, in groups of similar lines."""

    def __init__(self) -> None:
        self.groups: list[list[Any]] = []  # [first line, count]
        self.start = time.time()

    def add(self, line: str) -> None:
        best, best_d = None, SIMILARITY
        for g in self.groups:
            d = _distance(g[0], line)
            if d < best_d:
                best, best_d = g, d
        if best is None:
            self.groups.append([line, 1])
        else:
            best[1] += 1

    def take(self) -> str:
        """The window as printed (empty if it has no line), and a new window begins."""
        if not self.groups:
            return ""
        stamp = "%Y-%m-%d %H:%M:%S"
        out = [f"\x1b[36m>>> Aggregated Logs ({time.strftime(stamp, time.localtime(self.start))}) >>>\x1b[0m\n"]
        out += [f"\x1b[33m[{n} similar log lines]\x1b[0m {line}\n" for line, n in self.groups]
        out.append(f"\x1b[36m<<< Aggregated Logs ({time.strftime(stamp)}) <<<\x1b[0m\n\n")
        self.groups, self.start = [], time.time()
        return "".join(out)


class LogClient:
    """Prints what a mesh's forwarders send, on this process's stdout/stderr as they are now.

    Values arrive on the runtime's IO thread (``deliver``) and are handled on a thread of this
    client's, in order, so a slow terminal never holds up the runtime."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.window: float | None = None
        self.windows = {"stdout": _Window(), "stderr": _Window()}
        self.last_flush = time.monotonic()
        self.deadline: float | None = None
        self.version = 0
        self.waiting = 0
        self.flushed = threading.Condition()
        self.done_version = 0
        self.port_id = 0
        threading.Thread(target=self._run, name="monarch-log-client", daemon=True).start()

    # the runtime's port handler
    def deliver(self, reply: Any) -> None:
        if reply.ok:
            try:
                value = reply.payload.load() if hasattr(reply.payload, "load") else reply.payload
            except Exception as e:  # noqa: BLE001 - one bad value is dropped, the stream goes on
                log.debug("a forwarded log value did not decode: %s", e)
                return
            self.queue.put(value)

    def lost(self, addr: str, error: Any) -> None:
        pass  # a proc gone: the others still stream

    # commands from the manager, in order with the lines
    def set_window(self, window: float | None) -> None:
        done = threading.Event()
        self.queue.put(("window", window, done))
        done.wait(FLUSH_TIMEOUT_S)

    def start_flush(self, expected: int) -> int:
        with self.flushed:
            self.version += 1
            self.waiting = expected
            return self.version

    def wait_flush(self, version: int, timeout: float) -> bool:
        with self.flushed:
            return self.flushed.wait_for(lambda: self.done_version >= version, timeout)

    def force_print(self, version: int) -> None:
        """The barrier timed out: print what is here anyway, and let late markers be ignored."""
        self.queue.put(("print", version))

    def close(self) -> None:
        self.queue.put(None)

    def _run(self) -> None:
        while True:
            timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            try:
                item = self.queue.get(timeout=timeout)
            except queue.Empty:
                self._print_windows()
                continue
            if item is None:
                self._print_windows()
                return
            try:
                self._handle(item)
            except Exception as e:  # noqa: BLE001 - the printer thread outlives one bad item
                log.debug("log client: %s", e)

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "log":
            _, host, pid, target, lines = item
            if self.window is None:
                _write_all(1 if target == "stdout" else 2, "".join(f"[{host} {pid}] {ln}\n" for ln in lines).encode())
                self.last_flush = time.monotonic()
                return
            for ln in lines:
                self.windows[target].add(ln)
            due = self.last_flush + self.window
            if due <= time.monotonic():
                self._print_windows()
            elif self.deadline is None or due < self.deadline:  # a shorter window moves it closer
                self.deadline = due
        elif kind == "flush":
            with self.flushed:
                if item[1] != self.version or self.waiting <= 0:
                    return  # a marker of a barrier that already timed out
                self.waiting -= 1
                if self.waiting:
                    return
            self._print_windows()
            with self.flushed:
                self.done_version = item[1]
                self.flushed.notify_all()
        elif kind == "print":
            self._print_windows()
            with self.flushed:
                self.done_version = max(self.done_version, item[1])
                self.waiting = 0
                self.flushed.notify_all()
        elif kind == "window":
            _, window, done = item
            if self.window is not None and window is None:
                self._print_windows()  # what was being aggregated is printed before lines go out one by one
            self.window = window
            done.set()

    def _print_windows(self) -> None:
        for target, fd in (("stdout", 1), ("stderr", 2)):
            text = self.windows[target].take()
            if text:
                _write_all(fd, text.encode())
        self.last_flush = time.monotonic()
        self.deadline = None


class LoggingManager:
    """A proc mesh's logging options (``ProcMesh._logging_manager``, as Monarch names it)."""

    def __init__(self, pm: Any) -> None:
        self._pm = pm
        self._lock = threading.Lock()
        self._client: LogClient | None = None
        self._forwarders: Any = None
        self._rt: Any = None  # the runtime the client's port is open on

    @property
    def _logging_mesh_client(self) -> LogClient | None:
        return self._client

    def _ensure(self) -> Any:
        with self._lock:
            if self._forwarders is None:
                from monarch_agents.ports import Port
                from monarch.actor._client import ensure_runtime

                port: Any = None
                if _config.get_global_config().get("enable_log_forwarding"):
                    self._client = LogClient()
                    self._rt = ensure_runtime()
                    port = Port(self._rt.open_port(self._client))
                self._forwarders = self._pm.spawn("log_forwarder", _LogForwarder, port)
            return self._forwarders

    def set_mode(self, stream_to_client: bool, aggregate_window_sec: int | None, level: int) -> None:
        if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 255:
            raise ValueError(f"Invalid logging level: {level}")
        if aggregate_window_sec is not None and not stream_to_client:
            raise ValueError("aggregate_window_sec is set but stream_to_client is False: aggregation needs streaming")
        if stream_to_client and not _config.get_global_config().get("enable_log_forwarding"):
            warnings.warn("logging_option(stream_to_client=True) has no effect: log forwarding was off when "
                          "it was asked for. Call configure(enable_log_forwarding=True) first, or set "
                          "HYPERACTOR_MESH_ENABLE_LOG_FORWARDING=true.", stacklevel=3)
        forwarders = self._ensure()
        if self._client is not None:
            self._client.set_window(aggregate_window_sec)
        forwarders.set_mode.call(stream_to_client, level).get()

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        """Print everything the procs wrote so far (best effort: at most ``timeout`` s)."""
        client, forwarders = self._client, self._forwarders
        if client is None or forwarders is None:
            return
        deadline = time.monotonic() + timeout
        version = client.start_flush(len(forwarders))
        try:
            forwarders.flush.call(version).get(timeout=timeout)
            if client.wait_flush(version, max(0.0, deadline - time.monotonic())):
                return
        except Exception as e:  # noqa: BLE001 - best effort, as Monarch's: a flush never fails its caller
            log.debug("flushing proc logs: %s", e)
        client.force_print(version)
        client.wait_flush(version, 1.0)

    async def flush_async(self) -> None:
        """``flush()`` without blocking the running event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.flush)

    def close(self) -> None:
        """Stop the log client (after what it holds is printed) and close its port: a stopped mesh
        leaves no port, handler or thread behind in this process's runtime."""
        if self._client is not None:
            self._client.close()
            if self._rt is not None:
                self._rt.close_port(self._client.port_id)
