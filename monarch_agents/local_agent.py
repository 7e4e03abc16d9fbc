"""A user's shared local host agent: what lets ``this_host()`` in a fresh script answer in milliseconds.

Starting a host agent (an interpreter, its imports, a zygote importing the actor API) is most of
what a script pays before its first actor answers.  So the first ``this_host()`` of a script
starts one agent per user (and per interpreter, code tree, preloaded modules and ``MONARCH_*``
settings), detached from the script, and later scripts reuse it while it is warm.  Each script
is an *owner* of the agent while it runs:

* it connects to the agent's Unix socket in the user's runtime folder (``$XDG_RUNTIME_DIR/monarch``,
  else ``<tmp>/monarch-<uid>``; 0700 and owned by the user, or it is not used), and each side
  checks that the other runs as the same user (``SO_PEERCRED``);
* the agent hands it the job keys it runs with (they never touch argv, environ or a file);
* the script hands the agent its stdout and stderr (file descriptors, passed over the socket),
  its working directory and its runtime's address: its procs write where it writes and start
  where it stands, as with an agent of its own;
* when that connection closes (the script exits or dies), every proc it owned is stopped; a script
  that exits normally says goodbye first and waits (briefly) until they are gone.

With no owner and no child for ``MONARCH_AGENT_IDLE_S`` seconds (default 300) the agent exits and
removes its socket; one whose code was edited since it started is retired by the next script
(it takes no new owner and exits once idle), so edits never pile agents up.
``MONARCH_SHARED_AGENT=0`` turns this off (every script then starts a private
agent that exits with it, as before); the test suite does so except where it tests this module.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from monarch_agents.files import UnsafeFolder, private_dir
from monarch_agents.files import runtime_dir as shared_runtime_dir

if TYPE_CHECKING:
    from monarch_agents.host_agent import HostAgent

log = logging.getLogger("monarch.host_agent")

RUNTIME_DIR_ENV = "MONARCH_RUNTIME_DIR"
SHARED_ENV = "MONARCH_SHARED_AGENT"
IDLE_ENV = "MONARCH_AGENT_IDLE_S"
DEFAULT_IDLE_S = 300.0
#: ``MONARCH_*`` variables that differ per process and say nothing about how an agent behaves.
_PER_PROCESS_ENV = frozenset({"MONARCH_TEST_SESSION", "MONARCH_RUN_JOB", "MONARCH_ROOT", "MONARCH_SYS_PATH",
                              "MONARCH_ENV_UNSET", "MONARCH_CEILING_DIRECTORIES", "MONARCH_NOFILE_SOFT"})
#: What the agent's code is made of: a change to any of these files means another agent.
#: The packages whose code a shared agent's zygote and procs run (every folder below each, too: a
#: proc of a stale agent once ran an old monarch/config.py, which no listed folder named).
_CODE_DIRS = ("monarch", "monarch_agents", "monarch_telemetry", "monarch_rdmafs")
_MAX_MSG = 1 << 20
_START_TIMEOUT_S = 60.0
_BYE_TIMEOUT_S = 4.0
_SOCK_PATH_MAX = 107


def enabled() -> bool:
    return os.environ.get(SHARED_ENV, "1") not in ("0", "", "false", "no")


def runtime_dir() -> str | None:
    """The user's private folder for agent sockets (``monarch_rdmafs.private``'s rule: made 0700 if
    missing); None if it is not safe (another owner, a link, or writable by others): the caller then
    starts an agent of its own."""
    try:
        base = os.environ.get(RUNTIME_DIR_ENV)
        return private_dir(base) if base else shared_runtime_dir()
    except (UnsafeFolder, OSError) as e:
        log.warning("not using the shared host agent: %s", e)
        return None


def _code_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def agent_key(preload: list[str]) -> str:
    """Which agent a script may share: same interpreter, code tree, preloaded modules and
    ``MONARCH_*`` settings (its socket's name; see :func:`code_version` for the code's edits)."""
    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{sys.version}\0{_code_root()}\0{','.join(preload)}\0".encode())
    h.update(repr(sorted((k, v) for k, v in os.environ.items()
                         if k.startswith("MONARCH_") and k not in _PER_PROCESS_ENV)).encode())
    return h.hexdigest()[:20]


def code_version() -> str:
    """The agent's code as it is on disk now (names, mtimes and sizes of its files): an agent of an
    older version is retired by the first script that finds it, so edits never pile up agents."""
    h = hashlib.sha256()
    root = _code_root()
    for top in _CODE_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            entries = []
            for name in sorted(files):
                if name.endswith(".py"):
                    try:
                        st = os.stat(os.path.join(d, name))
                    except OSError:
                        continue
                    entries.append((name, st.st_mtime_ns, st.st_size))
            h.update(repr((os.path.relpath(d, root), entries)).encode())
    return h.hexdigest()[:20]


def _stdio_ids() -> tuple:
    """Which files fds 1 and 2 are (device, inode), to notice a redirection."""
    out = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _send(sock: socket.socket, msg: dict, fds: list[int] = ()) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


# -- the client's side --------------------------------------------------------------------------


@dataclass
class SharedAgent:
    """A connection to the shared agent, held for as long as this process owns what it spawns there."""

    sock: socket.socket
    addr: str
    host: str
    pid: int
    keys: dict
    env: dict
    stdio: tuple = ()
    _join_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def join(self, owner: str, cwd: str) -> None:
        """Become an owner: procs of ``owner`` write to our stdout/stderr and start in ``cwd``.

        Joining again hands over our stdout/stderr as they are now: procs started after it write
        there (as Monarch's local procs write to the stdout their host had when they started)."""
        with self._join_lock:
            self.stdio = _stdio_ids()
            _send(self.sock, {"op": "join", "owner": owner, "cwd": cwd}, [1, 2])
            answer, _ = _recv(self.sock)
        if not answer or not answer.get("ok"):
            raise RuntimeError(f"the shared host agent refused this client: {answer}")

    def stdio_moved(self) -> bool:
        """Whether our stdout or stderr is another file than the one we last handed over."""
        return _stdio_ids() != self.stdio

    def leave(self, timeout: float = _BYE_TIMEOUT_S) -> None:
        """Stop what we own there and wait (``timeout`` at most) until it has exited."""
        try:
            self.sock.settimeout(timeout)
            _send(self.sock, {"op": "bye"})
            _recv(self.sock)
        except (OSError, ValueError):
            pass
        finally:
            self.sock.close()


def connect(preload: list[str], bind: str, hostname: str, log_dir: str, pythonpath: str,
            start_timeout: float = _START_TIMEOUT_S) -> SharedAgent | None:
    """The shared agent for ``preload``, started (detached) if none runs; None where there can be none
    (or where it did not come up and answer within ``start_timeout`` s)."""
    if not enabled():
        return None
    d = runtime_dir()
    if d is None:
        return None
    key = agent_key(preload)
    path = os.path.join(d, f"agent-{key}.sock")
    if len(path) > _SOCK_PATH_MAX:
        return None
    version = code_version()
    for _ in range(3):
        sock = _try_connect(path)
        if sock is None:
            lock_fd = _lock_starter(os.path.join(d, f"agent-{key}.lock"))  # one starter; the others wait, then connect
            try:
                sock = _try_connect(path)
                if sock is None:
                    sweep(d, keep=key)  # what dead agents left here, now that one more is to start
                    _start(path, preload, bind, hostname, log_dir, pythonpath, start_timeout)
                    sock = _try_connect(path)
            finally:
                os.close(lock_fd)
        if sock is None:
            return None
        try:
            sock.settimeout(start_timeout)
            info, _ = _recv(sock)
            if info and info.get("version") != version:
                # Older code (edited since it started): it stops taking owners and exits once idle.
                _send(sock, {"op": "retire"})
                _recv(sock)
                info = None
            sock.settimeout(None)
        except (OSError, ValueError):
            info = None
        if info:
            return SharedAgent(sock, info["addr"], info["host"], info["pid"], info["keys"], info["env"])
        sock.close()
    return None


def _lock_starter(path: str) -> int:
    """The starter's lock of one agent key, held (LOCK_EX) on the file that is at ``path`` now: a
    lock taken on a file :func:`sweep` removed meanwhile would exclude nobody, so that is taken again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                return fd
        except FileNotFoundError:
            pass  # removed while we waited for it: take the new one
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


_SUFFIXES = (".lock", ".log", ".sock")


def sweep(d: str, keep: str = "") -> list[str]:
    """Remove from the runtime folder ``d`` the files of shared agents that are gone: ``agent-KEY``'s
    ``.sock``, ``.log`` and ``.lock`` (each new code tree or setting makes a new KEY, so they pile up).

    A KEY's files go only when all of these hold: they are ours (owner, plain file or socket, no
    link); nobody is starting its agent (its ``.lock`` is free, and held by us while we remove);
    no agent of it lives (its agent holds a shared lock on its ``.log`` for its whole life, and its
    socket, if any, refuses connections).  Returns what it removed."""
    try:
        names = os.listdir(d)
    except OSError:
        return []
    keys = {n[len("agent-"):-len(suf)] for n in names if n.startswith("agent-") for suf in _SUFFIXES if n.endswith(suf)}
    removed: list[str] = []
    for key in sorted(keys - {keep}):
        base = os.path.join(d, f"agent-{key}")
        try:
            lock_fd = os.open(base + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.fstat(lock_fd)
            if st.st_uid != os.getuid() or st.st_ino != os.stat(base + ".lock", follow_symlinks=False).st_ino:
                continue
            if not _agent_gone(base):
                continue
            for suf in (".sock", ".log", ".lock"):  # the lock last, while we hold it
                p = base + suf
                try:
                    pst = os.stat(p, follow_symlinks=False)
                    if pst.st_uid == os.getuid() and (stat.S_ISREG(pst.st_mode) or stat.S_ISSOCK(pst.st_mode)):
                        os.unlink(p)
                        removed.append(p)
                except FileNotFoundError:
                    pass
        except OSError:
            continue  # held by a starter (EWOULDBLOCK), or not ours to judge
        finally:
            os.close(lock_fd)
    if removed:
        log.info("removed %d files of shared agents that are gone from %s", len(removed), d)
    return removed


def _agent_gone(base: str) -> bool:
    """No agent of ``base`` lives: its log is not locked by one, and its socket answers nobody."""
    try:
        fd = os.open(base + ".log", os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = -1
    except OSError:
        return False
    try:
        if fd >= 0:
            if os.fstat(fd).st_uid != os.getuid():
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # its agent (or the zygote forked from it) holds it
        # An agent of older code holds no lock on its log: its socket says whether it lives.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(base + ".sock")
            return False
        except (FileNotFoundError, ConnectionRefusedError):
            return True
        except OSError:
            return False
        finally:
            probe.close()
    finally:
        if fd >= 0:
            os.close(fd)


def _try_connect(path: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    if _peer_uid(s) != os.getuid():  # someone else's socket where ours should be: never talk to it
        s.close()
        return None
    return s


def _start(path: str, preload: list[str], bind: str, hostname: str, log_dir: str, pythonpath: str,
           start_timeout: float) -> None:
    from monarch_agents.keys import JobKeys
    from monarch_rdmafs.helper import HelperProcess

    try:
        os.unlink(path)  # a dead agent's socket (nothing answered on it)
    except FileNotFoundError:
        pass
    idle = os.environ.get(IDLE_ENV, str(DEFAULT_IDLE_S))
    cmd = [sys.executable, "-m", "monarch_agents.host_agent", "--shared-socket", path, "--idle-exit", idle,
           "--fork-zygote", "--hostname", hostname, "--bind", bind, "--preload", ",".join(preload),
           "--log-dir", log_dir]
    log_fd = os.open(path[:-len(".sock")] + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # Shared, on the open file the agent inherits as its stdout and stderr: held for as long as
        # it (and its zygote) lives, it is how sweep() tells a live agent's files from a dead one's.
        fcntl.flock(log_fd, fcntl.LOCK_SH)
        # Its own session, stdio and cwd: nothing ties it to the script that happened to start it.
        agent = HelperProcess(cmd, env={**os.environ, "PYTHONPATH": pythonpath}, ready_fd_flag="--info-fd",
                              stdout=log_fd, stderr=log_fd, cwd="/")
        agent.start((json.dumps(JobKeys.generate().as_dict()) + "\n").encode(), keep_stdin=False)
    finally:
        os.close(log_fd)
    try:
        agent.wait_ready(start_timeout)  # until it says where it listens, or exits
    finally:
        agent.detach()  # it outlives us: the next script finds it by its socket


# -- the agent's side ---------------------------------------------------------------------------


class OwnerListener:
    """The shared agent's Unix socket: one connection per owner (see the module docstring)."""

    def __init__(self, agent: "HostAgent", path: str, idle_s: float):
        self.agent = agent
        self.path = path
        self.idle_s = idle_s
        self.lock = threading.Lock()
        self.conns = 0
        self.idle_since = time.monotonic()
        #: The code this agent runs (see code_version), computed at its start.
        self.version = code_version()
        self.retired = False
        #: Its threads and the owners' live connections, so that stop() can wake and join them.
        self._threads: list[threading.Thread] = []
        self._live: set[socket.socket] = set()
        old = os.umask(0o077)
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            self.sock.bind(path)
        finally:
            os.umask(old)
        self._ino = os.stat(path).st_ino
        self.sock.listen(64)

    def retire(self) -> None:
        """Newer code wants this socket: take no new owner, and exit once the last one is gone."""
        self.retired = True
        self.close()

    def start(self) -> None:
        self._spawn(self._accept, "owners")
        self._spawn(self._idle_watch, "idle")

    def _spawn(self, target, name: str, *args) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self.lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def stop(self, deadline: float) -> None:
        """Take no new owner, wake every owner's thread (their procs go with the agent), and join
        this listener's threads by ``deadline`` (``time.monotonic()``); the agent is stopping."""
        self.close()
        with self.lock:
            live, threads = list(self._live), list(self._threads)
        for conn in live:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its own thread
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        try:
            if os.stat(self.path).st_ino == self._ino:  # not a newer agent's socket
                os.unlink(self.path)
        except OSError:
            pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept(); close() alone does not
        except OSError:
            pass  # closed already
        self.sock.close()

    def _accept(self) -> None:
        while not self.agent.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if _peer_uid(conn) != os.getuid():
                conn.close()
                continue
            with self.lock:
                self.conns += 1
                self._live.add(conn)
            self._spawn(self._serve, "owner", conn)

    def _serve(self, conn: socket.socket) -> None:
        agent = self.agent
        owner = ""
        try:
            _send(conn, {"addr": agent.rt.addr, "host": agent.host, "pid": os.getpid(), "keys": agent.keys.as_dict(),
                         "env": agent.child_env({}), "version": self.version})
            while True:
                msg, fds = _recv(conn, 2)
                if msg is None:
                    return
                # A second join of the same owner hands over its stdout/stderr again (it redirected them).
                if msg.get("op") == "join" and owner in ("", str(msg["owner"])) and len(fds) == 2:
                    owner = str(msg["owner"])
                    agent.add_owner_place(owner, fds, str(msg.get("cwd") or "/"))
                    _send(conn, {"ok": True})
                    continue
                for fd in fds:
                    os.close(fd)
                if msg.get("op") == "retire":
                    self.retire()
                    _send(conn, {"retired": True})
                    return
                if msg.get("op") == "bye":
                    if owner:
                        agent.release_owner(owner, wait_s=_BYE_TIMEOUT_S - 1)
                        owner = ""
                    _send(conn, {"bye": True})
                    return
        except (OSError, ValueError) as e:
            log.debug("owner connection failed: %s", e)
        finally:
            if owner:  # gone without a goodbye (killed), or the agent stops: its procs go too
                try:
                    agent.release_owner(owner, wait_s=0)
                except Exception as e:  # the agent is stopping under us: its own stop reaps them
                    log.debug("releasing owner %s failed: %s", owner, e)
            conn.close()
            with self.lock:
                self.conns -= 1
                self._live.discard(conn)
                self.idle_since = time.monotonic()

    def _idle_watch(self) -> None:
        while not self.agent.stopping.wait(min(1.0, self.idle_s / 4)):
            with self.lock:
                busy = self.conns > 0
                if busy or self.agent.children:
                    self.idle_since = time.monotonic()
                    continue
                if self.retired or time.monotonic() - self.idle_since >= self.idle_s:
                    log.info("no owner for %.0f s: the shared agent exits", self.idle_s)
                    self.close()  # no new owner from here on
                    self.agent.request_stop()
                    return

