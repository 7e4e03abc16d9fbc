"""The rank side of remote debugging: ``breakpoint()`` pauses this rank in a pdb relayed to ``monarch debug``.

A rank (a command ``monarch run`` started, a torchrun worker, or an actor's thread in a
proc agent) that calls ``breakpoint()``, ``pdb.set_trace()``, or fails with ``monarch run
--pdb``, connects to its host agent's debug socket, registers a session, and runs a real
:class:`pdb.Pdb` whose input and output travel over that connection.  The host agent
relays them to whichever ``monarch debug`` attaches, over the job's authenticated
connections; nothing here listens on a port.

This module imports only the standard library: it is loaded by whatever Python the
user's command runs (``PYTHONBREAKPOINT`` names it, through the shim in ``_debughook/``),
which may not have monarch installed.

The link: an abstract Unix socket named in ``MONARCH_DEBUG_SOCK``.  Each side checks that
the kernel reports the same user at the other end (``SO_PEERCRED``), and the host agent
also that the rank is a process it started (its descendant).  No secret: none is in the
rank's environment, where every process the user's program starts would inherit it.  Frames are ``(type: u8, length: u32)`` and a payload (JSON or raw bytes).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import struct
import sys
import threading
from typing import Any

SOCK_ENV = "MONARCH_DEBUG_SOCK"
POST_MORTEM_ENV = "MONARCH_DEBUG_POST_MORTEM"

HEAD = struct.Struct("!BI")
#: A frame longer than this is a broken stream.
MAX_FRAME = 64 << 20
#: Output goes in frames of at most this much (pdb printing a 100 MB value was one frame over
#: MAX_FRAME: the agent dropped the session, said "rank 0 exited", and the program went on).
OUT_PIECE = 1 << 20
#: The most output a rank queues for its host agent: beyond it pdb's write waits (the agent stops reading
#: while its holder is a window behind, so a stopped debugger blocks pdb instead of growing the rank).
OUT_QUEUED_MAX = 4 << 20

# rank -> agent
HELLO = 1       # json: who this session is
OUT = 2         # bytes: pdb output
READ = 3        # json: pdb waits for a command here ({file, line, function})
SRC_REQ = 4     # json: {files: [...]} this host lacks
END = 5         # json: {reason}: the rank left the debugger
COMPLETIONS = 6  # json: {id, matches}
# agent -> rank
WELCOME = 20    # json: {sid}
IN = 21         # bytes: one command line; empty means end of input (Ctrl-D)
INTR = 22       # interrupt the running command (Ctrl-C)
SRC = 23        # json: {files: {name: text}}
COMPLETE = 24   # json: {id, text, line, begidx, endidx}

_SRC_WAIT_S = 3.0
_CLOSE_WAIT_S = 2.0
_CONNECT_TIMEOUT_S = 5.0


def _frame(kind: int, payload: bytes | dict) -> bytes:
    if isinstance(payload, dict):
        payload = json.dumps(payload).encode()
    return HEAD.pack(kind, len(payload)) + payload


def send_frame(sock: socket.socket, kind: int, payload: bytes | dict) -> None:
    """Write one frame (a dict goes as JSON)."""
    sock.sendall(_frame(kind, payload))


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes from ``sock``, or None if the stream ends first.

    Also the socket reader of monarch's gateway and telemetry collector: this module is the lowest
    one all of them import, and imports only the standard library (see above)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> tuple[int, bytes] | None:
    """One frame, or None at end of stream; ValueError for a frame that breaks the protocol."""
    head = recv_exact(sock, HEAD.size)
    if head is None:
        return None
    kind, n = HEAD.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"debug frame of {n} bytes")
    body = recv_exact(sock, n) if n else b""
    if body is None:
        return None
    return kind, body


def peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel noted them when it connected (or listened)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def peer_uid(sock: socket.socket) -> int:
    return peer_cred(sock)[1]


# -- who this rank is -----------------------------------------------------------------


def _describe(kind: str, frame: Any) -> dict:
    """The session's registration: rank, host, what runs here, where it stopped."""
    env = os.environ
    info: dict[str, Any] = {
        "kind": kind, "pid": os.getpid(), "host": env.get("MONARCH_HOSTNAME") or socket.gethostname(),
        "host_rank": int(env.get("MONARCH_HOST_RANK", "0") or 0), "run_id": env.get("MONARCH_RUN_ID", ""),
        "thread": threading.current_thread().name,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "name": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python",
        "actor": "", "coords": {},
    }
    # torchrun's global rank, else the host's index in the `monarch run` (what its output is prefixed by).
    rank = env.get("RANK") or env.get("NODE_RANK") or "0"
    info["rank"] = int(rank) if rank.lstrip("-").isdigit() else 0
    ctx_mod = sys.modules.get("monarch_agents.context")
    if ctx_mod is not None:  # inside a proc agent: the actor whose endpoint stopped
        ctx = ctx_mod.current()
        if ctx.actor is not None:
            info.update(actor=ctx.actor.name, name=ctx.actor.name, rank=ctx.actor.rank,
                        coords=dict(ctx.actor.point), command=f"{ctx.actor.class_name} actor {ctx.actor.name!r}")
    info.update(_where(frame))
    return info


def _where(frame: Any) -> dict:
    if frame is None:
        return {"file": "", "line": 0, "function": ""}
    return {"file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name}


# -- the link to the host agent ----------------------------------------------------------


class LinkClosed(Exception):
    """The host agent went away (or never answered)."""


class _Link:
    """This thread's session with its host agent: a writer queue, and a reader thread that
    hands command lines to pdb and carries out interrupts."""

    def __init__(self, sock: socket.socket, sid: int, pdb_thread: threading.Thread):
        self.sock = sock
        self.sid = sid
        self.pdb_thread = pdb_thread
        self.lines: queue.SimpleQueue = queue.SimpleQueue()
        self.sources: queue.SimpleQueue = queue.SimpleQueue()
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        #: Bytes of OUT frames queued and not yet written; pdb waits while more than OUT_QUEUED_MAX are.
        self.queued = 0
        self.drained = threading.Condition()
        self.closed = threading.Event()
        self.pdb: Any = None
        # The pdb thread never writes to the socket itself: an interrupt landing in the middle of
        # a write would cut a frame in two.  The writer thread does it.
        self.writer = threading.Thread(target=self._write_loop, name="monarch-debug-writer", daemon=True)
        self.writer.start()
        threading.Thread(target=self._read_loop, name="monarch-debug-reader", daemon=True).start()

    @classmethod
    def open(cls, kind: str, frame: Any) -> "_Link":
        name = os.environ.get(SOCK_ENV, "")
        if not name:
            raise LinkClosed("not started by a monarch host agent (no MONARCH_DEBUG_SOCK)")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(_CONNECT_TIMEOUT_S)
        try:
            sock.connect("\0" + name)
            if peer_uid(sock) != os.getuid():
                raise LinkClosed("the debug socket belongs to another user")
            send_frame(sock, HELLO, _describe(kind, frame))
            got = recv_frame(sock)
        except (ConnectionResetError, BrokenPipeError):
            # The agent closes at once, unread, on a process it did not start (not one of its ranks).
            sock.close()
            raise LinkClosed("the host agent refused the debug session") from None
        except (OSError, ValueError) as e:
            sock.close()
            raise LinkClosed(f"host agent's debug socket: {e}") from None
        if got is None or got[0] != WELCOME:
            sock.close()
            raise LinkClosed("the host agent refused the debug session")
        sock.settimeout(None)
        return cls(sock, json.loads(got[1])["sid"], threading.current_thread())

    def send(self, kind: int, payload: bytes | dict) -> None:
        if self.closed.is_set():
            return
        if kind == OUT and payload:
            view = memoryview(payload)  # type: ignore[arg-type]
            for i in range(0, len(view), OUT_PIECE):
                piece = bytes(view[i:i + OUT_PIECE])
                self._wait_room()
                with self.drained:
                    self.queued += len(piece)
                self.out.put((kind, piece))
            return
        self.out.put((kind, payload))

    def _wait_room(self) -> None:
        """Until the queued output is under OUT_QUEUED_MAX (never in the writer itself, never once closed)."""
        if threading.current_thread() is self.writer:
            return
        with self.drained:
            while self.queued >= OUT_QUEUED_MAX and not self.closed.is_set():
                self.drained.wait(1.0)

    def _write_loop(self) -> None:
        while True:
            items = [self.out.get()]
            # Whatever else is queued goes in the same write (pdb's answer, its prompt, READ).
            while items[-1] is not None:
                try:
                    items.append(self.out.get_nowait())
                except queue.Empty:
                    break
            last = items[-1]
            try:
                self.sock.sendall(b"".join(_frame(*item) for item in items if item is not None))
            except OSError:
                self._closed()
                return
            written = sum(len(item[1]) for item in items if item is not None and item[0] == OUT)
            if written:
                with self.drained:
                    self.queued -= written
                    self.drained.notify_all()
            if last is None:
                break
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _read_loop(self) -> None:
        try:
            while True:
                got = recv_frame(self.sock)
                if got is None:
                    break
                kind, body = got
                if kind == IN:
                    self.lines.put(body)
                elif kind == INTR:
                    self._interrupt()
                elif kind == SRC:
                    self.sources.put(json.loads(body).get("files", {}))
                elif kind == COMPLETE:
                    self._complete(json.loads(body))
        except (OSError, ValueError):
            pass
        self._closed()

    def _closed(self) -> None:
        self.closed.set()
        self.lines.put(None)
        self.sources.put({})
        with self.drained:
            self.drained.notify_all()

    def close(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.out.put((END, {"reason": reason}))
        self.out.put(None)
        self.closed.set()
        # The program may exit right after `c`: let the last output and the END leave first.
        if threading.current_thread() is not self.writer:
            self.writer.join(_CLOSE_WAIT_S)

    def _interrupt(self) -> None:
        """Ctrl-C in ``monarch debug``: a KeyboardInterrupt in the pdb thread, as a local Ctrl-C would."""
        t = self.pdb_thread
        if t is threading.main_thread():
            import signal

            signal.pthread_kill(t.ident, signal.SIGINT)  # wakes a blocking call, as a real Ctrl-C does
        elif t.ident is not None:
            import ctypes

            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(KeyboardInterrupt))

    def _complete(self, req: dict) -> None:
        matches: list[str] = []
        p = self.pdb
        if p is not None:
            try:
                text, line, beg, end = req["text"], req["line"], req["begidx"], req["endidx"]
                stripped = len(line) - len(line.lstrip())
                if beg - stripped <= 0:
                    matches = p.completenames(text, line, beg, end)
                else:
                    cmd = p.parseline(line.lstrip())[0] or ""
                    fn = getattr(p, "complete_" + cmd, None) or p.completedefault
                    matches = list(fn(text, line, beg, end) or [])
            except Exception:
                matches = []
        self.send(COMPLETIONS, {"id": req.get("id"), "matches": matches[:500]})


class _Output:
    """pdb's stdout: text goes to the host agent; ``.buffer`` takes bytes (``!sys.stdout.buffer.write``)."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, link: _Link):
        self.link = link
        self.buffer = _BinaryOutput(link)

    def write(self, s: str) -> int:
        if s:
            self.link.send(OUT, s.encode("utf-8", "backslashreplace"))
        return len(s)

    def writelines(self, lines: Any) -> None:
        for s in lines:
            self.write(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


class _BinaryOutput:
    def __init__(self, link: _Link):
        self.link = link

    def write(self, b: bytes) -> int:
        if b:
            self.link.send(OUT, bytes(b))
        return len(b)

    def flush(self) -> None:
        pass


class _Input:
    """pdb's stdin: each ``readline`` tells the host agent that pdb waits, then takes the next line."""

    encoding = "utf-8"

    def __init__(self, link: _Link):
        self.link = link

    def readline(self, size: int = -1) -> str:
        link = self.link
        p = link.pdb
        _forget_caught_interrupt()
        link.send(READ, _where(getattr(p, "curframe", None)))
        while True:
            try:
                # A timeout, so that an interrupt sent to a non-main thread is raised promptly.
                line = link.lines.get(timeout=0.2)
                break
            except queue.Empty:
                continue
        if line is None:
            # The host agent is gone (the reservation was released): nothing can ever answer, so
            # the rank goes on as if continued, instead of dying of a debugger error.
            if p is not None:
                p.clear_all_breaks()
            return "continue\n"
        if p is not None and line:
            p.fetch_missing_sources()
        return line.decode("utf-8", "replace")

    def isatty(self) -> bool:
        return False


def _forget_caught_interrupt() -> None:
    """Undo the mark an interrupted pdb command leaves, so the program does not die of SIGINT at exit.

    A KeyboardInterrupt that leaves an ``eval()`` of a string (how pdb runs ``p``, ``pp``,
    ``display``, ``whatis`` ...) marks the interpreter as stopped by an unhandled Ctrl-C, even
    though pdb caught it and the program goes on; when the program later ends, CPython honours
    the mark by killing itself with SIGINT (the exit status of bpo-1054041), and ``monarch run``
    then stops the other ranks.  Every string ``eval()`` that returns clears the mark, which is
    why any completed ``p x`` hid the bug.  pdb asks for its next command only after the
    interrupted one is over, so clearing it here, each time, covers an interrupt followed at
    once by ``c`` or ``n``.  (An interrupt landing inside this very eval propagates out of
    ``readline``; pdb says --KeyboardInterrupt-- and asks again, clearing it again.)
    """
    eval("None")


def _pdb_class() -> type:
    import pdb

    class RemotePdb(pdb.Pdb):
        """A real pdb whose terminal is ``monarch debug``."""

        def __init__(self, link: _Link):
            super().__init__(stdin=_Input(link), stdout=_Output(link))
            self.link = link
            link.pdb = self
            self.prompt = "(Pdb) "
            self._asked: set[str] = set()

        def do_clear(self, arg: str) -> None:
            # `clear` with no argument asks for confirmation through input(), which would read
            # the rank's own stdin; `monarch debug`'s `continue` sends it to drop every breakpoint.
            if not arg:
                self.clear_all_breaks()
            else:
                super().do_clear(arg)

        def set_continue(self) -> None:
            super().set_continue()
            if not self.breaks:
                # Nothing can stop this thread again: the session is over until the next breakpoint().
                self.end("continued")

        def set_quit(self) -> None:
            super().set_quit()
            self.end("quit")

        def end(self, reason: str) -> None:
            self.link.close(reason)
            _sessions.pop((os.getpid(), threading.get_ident()), None)

        def fetch_missing_sources(self) -> None:
            """Source lines for files this host lacks come from the client's copy."""
            import linecache

            missing = []
            for frame, _ in self.stack or []:
                name = frame.f_code.co_filename
                if name in self._asked or name.startswith("<") or os.path.exists(name):
                    continue
                self._asked.add(name)
                if not linecache.getlines(name, frame.f_globals):
                    missing.append(name)
            if not missing:
                return
            self.link.send(SRC_REQ, {"files": missing})
            try:
                files = self.link.sources.get(timeout=_SRC_WAIT_S)
            except queue.Empty:
                return
            for name, text in files.items():
                if isinstance(text, str):
                    linecache.cache[name] = (len(text), None, text.splitlines(keepends=True), name)

    return RemotePdb


_sessions: dict[tuple[int, int], Any] = {}  # (pid, thread ident) -> its RemotePdb while a session is open
_lock = threading.Lock()


def _session(kind: str, frame: Any) -> Any:
    key = (os.getpid(), threading.get_ident())  # a forked child must not reuse its parent's connection
    p = _sessions.get(key)
    if p is not None and not p.link.closed.is_set():
        return p
    link = _Link.open(kind, frame)
    p = _pdb_class()(link)
    _sessions[key] = p
    return p


def _pause(frame: Any, header: str | None, called_as: str) -> None:
    """Stop in ``frame`` until ``monarch debug`` continues this rank (never stops the program itself)."""
    try:
        p = _session("breakpoint", frame)
    except LinkClosed as e:
        sys.stderr.write(f"monarch: {called_as} ignored: no debug session ({e})\n")
        return
    if header is not None:
        p.message(header)
    p.set_trace(frame)


#: In a proc agent, set by monarch (``monarch._src.actor.debugger.breakpoint``): offers a breakpoint in an
#: actor to the program's own debugger actor (Monarch's ``DebugController``, where the program made one)
#: and says whether that took it; else ``monarch debug`` does.
actor_debugger: Any = None


def set_trace(*args: Any, header: str | None = None, **kwargs: Any) -> None:
    """``breakpoint()``: pause here until ``monarch debug`` continues this rank."""
    frame = sys._getframe(1)
    if actor_debugger is not None and actor_debugger(frame, header):
        return
    _pause(frame, header, "breakpoint()")


def post_mortem(tb: Any = None) -> None:
    """A pdb session on a traceback (``monarch run --pdb``); returns when the debugger continues or quits."""
    if tb is None:
        tb = sys.exc_info()[2]
    if tb is None:
        return
    frame = tb
    while frame.tb_next is not None:
        frame = frame.tb_next
    try:
        p = _session("post_mortem", frame.tb_frame)
    except LinkClosed as e:
        sys.stderr.write(f"monarch: no post-mortem session ({e})\n")
        return
    p.reset()
    try:
        p.interaction(None, tb)
    except LinkClosed:
        pass
    p.end("post-mortem finished")


def _excepthook(etype: type, value: BaseException, tb: Any) -> None:
    _previous_excepthook(etype, value, tb)
    if tb is not None and not issubclass(etype, (KeyboardInterrupt, SystemExit)):
        sys.stderr.write("monarch: uncaught exception; post-mortem session open (attach with `monarch debug`)\n")
        sys.stderr.flush()
        post_mortem(tb)


_previous_excepthook = sys.excepthook


def _pdb_set_trace(*, header: str | None = None) -> None:
    """Stands in for ``pdb.set_trace()``."""
    _pause(sys._getframe(1), header, "pdb.set_trace()")


def patch_pdb(pdb_module: Any) -> None:
    """Make ``pdb.set_trace()`` open a remote session too."""
    pdb_module.set_trace = _pdb_set_trace


class _PdbPatcher:
    """Patches ``pdb`` when (if ever) it is imported: importing it up front would cost every rank ~10 ms."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "pdb":
            return None
        from importlib.machinery import PathFinder

        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch_pdb(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Route ``breakpoint()``, ``pdb.set_trace()`` (and, with --pdb, uncaught exceptions) to ``monarch debug``.

    Called at start in every rank the host agent started (``_debughook/sitecustomize.py``) and in proc agents.
    """
    global _previous_excepthook
    if not os.environ.get(SOCK_ENV):
        return
    if os.environ.get("PYTHONBREAKPOINT", "") in ("", __name__ + ".set_trace", "monarch_breakpoint.set_trace"):
        sys.breakpointhook = set_trace
    if "pdb" in sys.modules:
        patch_pdb(sys.modules["pdb"])
    elif not any(isinstance(f, _PdbPatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _PdbPatcher())
    if os.environ.get(POST_MORTEM_ENV) == "1" and sys.excepthook is not _excepthook:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook
