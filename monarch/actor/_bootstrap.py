"""Monarch's worker bootstrap: workers wait at an address, a client attaches to them.

On each worker machine::

    run_worker_loop_forever(ca="trust_all_connections", address="tcp://worker1:4444")

and in the client::

    hosts = attach_to_workers(ca="trust_all_connections", workers=["tcp://worker1:4444", ...])
    procs = hosts.spawn_procs(per_host={"gpus": 8})

How it is done here: the worker listens at ``address`` (``tcp://HOST:PORT``, or ``ipc://PATH``: a
Unix socket, mode 0600, for a worker on the client's machine).  A client that connects first proves,
and has the worker prove, that both hold this user's *worker secret* (``~/.monarch/worker.key``, 0600,
made at first use; or the file ``MONARCH_WORKER_SECRET_FILE`` names), by a challenge and response
that never sends it (``monarch/actor/_worker_auth.py``); only then does it send, sealed with a key of
that session, the keys of a job made for these workers (each ``attach_to_workers`` call makes one, so
they open nothing else of the client's).  The worker starts a monarch host agent with them (on the
worker's address, a port of its own) and answers that agent's address, sealed too.  From then on
client and agent talk CURVE as in any reservation.  Clients are served one at a time; a connection
has 10 s to prove the secret, and at most 16 wait to (one more closes the oldest).  When the
client's connection closes (the client exited), the worker stops its agent, and with it every proc,
and waits for the next client, as Monarch's worker does; when the client shuts the host mesh down
(``HostMesh.shutdown``), the worker loop returns, as Monarch's does.

As in Monarch, ``ca="trust_all_connections"`` is the only accepted setting, and TLS keys raise
``NotImplementedError``.  In Monarch it means that no certificate authority checks the peer; here the
worker secret does instead, and there is no setting that accepts a peer without it: another local
user who reaches the address (or listens there first) learns a nonce and gets a one-line refusal.
Workers on other machines need the same secret file (a shared home has it; else copy it, 0600, or
mount it and name it with ``MONARCH_WORKER_SECRET_FILE``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence, Union

from monarch import config as _config
from monarch.actor import _worker_auth
from monarch_agents.future import Future
from monarch_agents.unproven import UnprovenConnections

PrivateKey = Union[bytes, Path, None]
CA = Union[bytes, Path, Literal["trust_all_connections"]]

_ENROLL_TIMEOUT_S = 60.0
#: How long a connection to a worker has to prove the worker secret (a client does it in milliseconds).
_HELLO_S = 10.0
#: Connections to one worker that have not proved it yet, at most (one more closes the oldest).
_UNPROVEN_MAX = 16

log = logging.getLogger("monarch.actor")


def _check_security(private_key: PrivateKey, ca: CA) -> None:
    if private_key is not None or ca != "trust_all_connections":
        raise NotImplementedError("TLS keys are not supported: give ca='trust_all_connections' "
                                  "(monarch's workers then authenticate with your worker secret, "
                                  "~/.monarch/worker.key, and its agents with CURVE keys of the client's job)")


def _parse(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT``, ``tcp://ADVERTISE:PORT@tcp://BIND:PORT`` or ``PROC_ID@tcp://HOST:PORT``:
    (host to bind, port)."""
    parts = address.split("@")
    urls = [p for p in parts if "://" in p]
    if not urls:
        raise ValueError(f"worker address {address!r} is not a tcp://HOST:PORT address")
    url = urls[-1]  # the bind side of 'advertise@bind', or the location of 'proc_id@location'
    scheme, _, rest = url.partition("://")
    if scheme != "tcp":
        raise NotImplementedError(f"worker address {address!r}: only tcp:// workers are supported here")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"worker address {address!r} has no port (tcp://HOST:PORT)")
    host = host.strip("[]")
    if host == "*":
        raise NotImplementedError("a wildcard worker address does not say which name clients use; "
                                  "give the worker's name or address (tcp://worker-fqdn:4444)")
    return host, int(port)


def _inherited_fd(address: str) -> int | None:
    """N of a ``tcp://HOST:fdN`` worker address (listen on inherited file descriptor N), else None."""
    if not address.startswith("tcp://") or "@" in address:
        return None
    port = address.rpartition(":")[2]
    return int(port[2:]) if port.startswith("fd") and port[2:].isdigit() else None


def _ipc_path(address: str) -> str | None:
    """The socket path of an ``ipc://PATH`` worker address (a worker on this machine), else None."""
    return address[len("ipc://"):] if address.startswith("ipc://") else None


def _dial_address(address: str) -> tuple[str, int]:
    """Where a client connects for ``address`` (the advertised side of ``advertise@bind``); for an
    ``ipc://PATH`` worker, ``("", 0)`` (it is dialled at its path)."""
    if _ipc_path(address) is not None:
        return "", 0
    parts = [p for p in address.split("@") if "://" in p]
    if not parts:
        raise ValueError(f"worker address {address!r} is not a tcp://HOST:PORT address")
    host, _, port = parts[0].partition("://")[2].rpartition(":")
    return host.strip("[]"), int(port)


class _Worker:
    """The listening side of a worker loop: each connection proves the worker secret (in a thread of
    its own, by a deadline) before it is queued for the loop; clients are then served one at a time.

    Connections that have not proved it yet are capped (:data:`_UNPROVEN_MAX`): one more closes the
    oldest, so another local user opening connections and sending nothing neither exhausts the
    worker's descriptors nor keeps a client out for longer than it takes that client to prove.
    """

    def __init__(self, listener: socket.socket, secret: bytes, bind_host: str = "127.0.0.1"):
        from monarch.actor._gateway import WorkerGateway

        self.listener = listener
        self.secret = secret
        #: Streams for clients attached through this worker (``attach(addr)``), served beside the queue.
        self.gateway = WorkerGateway(bind_host)
        self.proven: "queue.Queue[_worker_auth.Session]" = queue.Queue()
        self.lock = threading.Lock()
        self.unproven = UnprovenConnections(_UNPROVEN_MAX)
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept, name="monarch-worker-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:
                if self.closed:
                    conn.close()
                    return
                self.unproven.admit(conn)
            threading.Thread(target=self._prove, args=(conn,), name="monarch-worker-hello", daemon=True).start()

    def _prove(self, conn: socket.socket) -> None:
        try:
            session = _worker_auth.accept(conn, self.secret, time.monotonic() + _HELLO_S)
        except (OSError, ValueError) as e:
            # A stranger, a wrong secret, or a connection dropped for a newer one: closed, nothing started.
            if isinstance(e, _worker_auth.WorkerAuthError):
                log.warning("monarch worker: refused a connection: %s", e)
            conn.close()
            return
        finally:
            self.unproven.proven(conn)
        if "gateway" in session.request:
            self.gateway.serve(session)  # on this connection's thread: not one client at a time
            return
        self.proven.put(session)

    def next(self, timeout: float | None = None) -> "_worker_auth.Session":
        return self.proven.get(timeout=timeout)

    def close(self) -> None:
        with self.lock:
            self.closed = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()
        self.unproven.shut_all()
        self.gateway.close()
        while True:
            try:
                self.proven.get_nowait().conn.close()
            except queue.Empty:
                break


def _serve_one(session: "_worker_auth.Session", bind_host: str) -> bool:
    """Serve one authenticated client: True when its host agent was shut down by it (``HostMesh.shutdown``)."""
    conn, hello = session.conn, session.request
    agent: subprocess.Popen | None = None
    try:
        keys = hello.get("keys")
        if not isinstance(keys, dict):
            session.answer(json.dumps({"error": "expected the job's keys"}).encode() + b"\n")
            return False
        r, w = os.pipe()
        hostname = hello.get("hostname") or os.environ.get("MONARCH_HOSTNAME") or socket.gethostname()
        cmd = [sys.executable, "-m", "monarch_agents.host_agent", "--ephemeral", "--inherit-stdio",
               "--info-fd", str(w), "--hostname", str(hostname), "--bind", bind_host,
               "--host-rank", str(int(hello.get("host_rank", 0)))]
        agent = subprocess.Popen(cmd, stdin=subprocess.PIPE, pass_fds=(w,), start_new_session=True)
        os.close(w)
        assert agent.stdin is not None
        agent.stdin.write((json.dumps(keys) + "\n").encode())
        agent.stdin.close()
        with os.fdopen(r, "rb") as info_file:
            info = info_file.readline()
        if not info:
            session.answer(json.dumps({"error": f"the host agent exited at start ({agent.wait()})"}).encode() + b"\n")
            return False
        session.answer(info)
        conn.settimeout(None)
        # Serve until the client goes away, or says its host mesh was shut down (its sealed
        # shutdown line: one written by anyone else on the way is ignored, said once).
        buf = b""
        forged = 0
        while True:
            ready, _, _ = select.select([conn], [], [], 0.5)
            if ready:
                data = conn.recv(4096)
                if not data:
                    return False
                buf += data
                *lines, buf = buf.split(b"\n")
                if len(buf) > _worker_auth.MAX_LINE:
                    lines.append(buf)
                    buf = b""
                for line in lines:
                    if session.is_shutdown(line):
                        return True
                    forged += 1
                    if forged == 1:
                        log.warning("monarch worker: ignored a line on a client's connection that is not its "
                                    "sealed shutdown (written by someone else on the way?)")
            if agent.poll() is not None:
                return False
    finally:
        conn.close()
        if agent is not None and agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(timeout=5)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()


def _listen(address: str) -> tuple[socket.socket, str]:
    path = _ipc_path(address)
    if path is not None:
        # A worker on this machine, at a Unix socket only its user may connect to; its host agent
        # listens on loopback.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            s.bind(path)
        finally:
            os.umask(old_umask)
        s.listen(_UNPROVEN_MAX)
        return s, "127.0.0.1"
    fd = _inherited_fd(address)
    if fd is not None:
        # ``tcp://HOST:fdN``: a socket its parent bound already and passed down (as in Monarch).
        s = socket.socket(fileno=fd)
        s.listen(_UNPROVEN_MAX)
        return s, address.split("://", 1)[1].rpartition(":")[0].strip("[]")
    host, port = _parse(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(_UNPROVEN_MAX)
    return s, host


def _loop(address: str, until_shutdown: bool, ready: Callable[[], None] = lambda: None,
          secret: bytes | None = None) -> None:
    secret = secret if secret is not None else _worker_auth.load_secret()  # before listening: a bad file fails first
    listener, host = _listen(address)
    worker = _Worker(listener, secret, host)
    worker.start()
    ready()
    try:
        while True:
            if _serve_one(worker.next(), host) and until_shutdown:
                return
    finally:
        worker.close()
        path = _ipc_path(address)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # the socket file of an ipc:// worker goes with it


def run_worker_loop_forever(*, private_key: PrivateKey = None, ca: CA, address: str) -> None:
    """Serve clients at ``address`` one after another (see the module docstring): a client that goes
    away is followed by the next; as in Monarch, one that shuts its host mesh down ends the loop."""
    _check_security(private_key, ca)
    _loop(address, until_shutdown=True)


def run_worker_loop_until_shutdown(*, private_key: PrivateKey = None, ca: CA, address: str) -> None:
    """Serve clients at ``address`` until one shuts its host mesh down, then return."""
    _check_security(private_key, ca)
    _loop(address, until_shutdown=True)


def start_worker_loop_forever(*, private_key: PrivateKey = None, ca: CA, address: str) -> Future[None]:
    """Start serving at ``address`` in the background; the future fails if the loop does."""
    _check_security(private_key, ca)
    fut: Future = Future()
    started = threading.Event()

    def run() -> None:
        try:
            _loop(address, until_shutdown=False, ready=started.set)
        except BaseException as e:  # noqa: BLE001 - the loop's failure is the future's outcome
            fut.set_exception(e)
        finally:
            started.set()

    threading.Thread(target=run, name="monarch-worker-loop", daemon=True).start()
    started.wait()
    return fut


#: Enrollment connections of this client (their sessions), kept open while it uses the workers.
_links: dict[str, "_worker_auth.Session"] = {}


def _connect_when_up(host: str, port: int, address: str, left: Callable[[str], float]) -> socket.socket:
    """Connect to a worker, waiting for one that is still starting (as Monarch's attach does: a
    program may start its workers and attach at once); ``left(address)`` is the attach barrier's time
    left (it raises once there is none: ``mesh_attach_config_timeout``)."""
    delay = 0.05
    path = _ipc_path(address)
    while True:
        remaining = left(address)
        try:
            if path is None:
                return socket.create_connection((host, port), timeout=remaining)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(remaining)
                s.connect(path)
            except BaseException:
                s.close()
                raise
            return s
        except (ConnectionRefusedError, FileNotFoundError):
            if delay > left(address):
                raise ConnectionRefusedError(f"worker {address}: nothing listens there (waited "
                                             "mesh_attach_config_timeout for it to start)") from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        except OSError:
            left(address)  # the barrier's time is up: say so; else the connection's own failure
            raise


def attach_to_workers(*, private_key: PrivateKey = None, ca: CA, workers: Sequence[Any],
                      name: Optional[str] = None) -> Any:
    """A ``HostMesh({hosts: len(workers)})`` of workers that run a worker loop (each a ``tcp://`` address,
    or a ``Future`` of one).

    Both ends prove this user's worker secret (``~/.monarch/worker.key``, or the file
    ``MONARCH_WORKER_SECRET_FILE`` names) before the job's keys go, sealed, to a worker; a worker
    that cannot prove it gets nothing, and the mesh's ``initialized`` raises why."""
    _check_security(private_key, ca)
    path = _worker_auth.secret_path()
    try:
        secret = _worker_auth.load_secret()
    except _worker_auth.WorkerAuthError as e:
        return _failed_mesh([w if isinstance(w, str) else "?" for w in workers],
                            RuntimeError(f"attach failed: {e}"))
    return _attach(workers, name, secret, path)


def _attach(workers: Sequence[Any], name: Optional[str], secret: bytes, secret_name: str) -> Any:
    from monarch.actor._client import ensure_runtime
    from monarch.actor._mesh import HostMesh
    from monarch.actor._shape import Shape
    from monarch_agents.keys import JobKeys
    from monarch_agents.messages import Ping

    # Monarch's attach barrier: every worker takes the job (our keys, where Monarch pushes its
    # settings) and confirms within mesh_attach_config_timeout, or the attach fails closed.
    limit = _config.seconds("mesh_attach_config_timeout")
    deadline = time.monotonic() + limit

    def left(address: str) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"worker {address} did not take the job within mesh_attach_config_timeout "
                               f"({limit:g} s)")
        return remaining

    # The workers are a job of their own, with keys made for them: what crosses the enrollment
    # connections opens these workers only, not this client's other jobs.  A client attached through a
    # gateway (attach(addr)) is one job with its workers, as in Monarch: this_host()'s procs and theirs
    # call each other.
    rt = ensure_runtime() if _gateway_of_client is not None else ensure_runtime(JobKeys.generate())
    refs: list = []
    try:
        _enroll(rt, workers, refs, left, secret, secret_name)
        for r in refs:  # each agent learns its owner (and stops when it goes away)
            try:
                rt.request(r.addr, lambda port: Ping(port)).get(timeout=left(r.addr))
            except Exception as e:
                failure: Exception = e
                try:
                    left(r.addr)  # the barrier's time is up: that is the failure
                except TimeoutError as late:
                    failure = late
                failure.worker = _worker_name(r.addr)  # type: ignore[attr-defined]
                raise failure from None
    except Exception as e:
        # As in Monarch, a failed attach fails closed, yet attach_to_workers returns: the mesh's
        # `initialized` (and any spawn on it) raises why, naming the worker.
        for r in refs:
            link = _links.pop(r.addr, None)
            if link is not None:
                link.conn.close()
        err = RuntimeError("attach failed: config push failed during attach on 1 host(s):\n"
                           f"  - {getattr(e, 'worker', '?')}: {e}")
        err.__cause__ = e
        return _failed_mesh([w if isinstance(w, str) else "?" for w in workers], err)
    mesh = HostMesh(refs, Shape(("hosts",), (len(refs),)))
    mesh._workers = True  # its shutdown() ends the workers' host agents, as Monarch's does
    return mesh


def _failed_mesh(addresses: list[str], err: BaseException) -> Any:
    """A host mesh of workers that could not be attached: using it raises ``err``."""
    import concurrent.futures

    from monarch.actor._pytokio import Shared
    from monarch.actor._client import HostRef
    from monarch.actor._mesh import HostMesh
    from monarch.actor._shape import Shape

    mesh = HostMesh([HostRef(a, a, i) for i, a in enumerate(addresses)], Shape(("hosts",), (len(addresses),)))
    failed: concurrent.futures.Future = concurrent.futures.Future()
    failed.set_exception(err)
    mesh._inner_host_mesh = Shared(failed)
    return mesh


def _enroll(rt: Any, workers: Sequence[Any], refs: list, left: Callable[[str], float], secret: bytes,
            secret_name: str) -> None:
    """Hand each worker the job's keys and note its agent (in ``refs``), in order."""
    from monarch_agents import runtime as rt_mod

    keys = rt.keys.as_dict()
    for rank, w in enumerate(workers):
        address = w.get() if isinstance(w, Future) else w
        try:
            _enroll_one(address, rank, keys, refs, left, secret, secret_name)
        except Exception as e:
            e.worker = _worker_name(address)  # type: ignore[attr-defined]
            raise
    rt_mod.claim(rt, [r.addr for r in refs])


def _worker_name(address: str) -> str:
    """A worker's address as Monarch's errors name it (``ipc://PATH`` is ``unix:PATH``)."""
    return "unix:" + address[len("ipc://"):] if address.startswith("ipc://") else address


def _enroll_one(address: str, rank: int, keys: dict, refs: list, left: Callable[[str], float], secret: bytes,
                secret_name: str) -> None:
    from monarch.actor._client import HostRef

    host, port = _dial_address(address)
    s = _connect_when_up(host, port, address, left)
    try:
        line, session = _worker_auth.connect(s, secret, {"keys": keys, "host_rank": rank}, time.monotonic() + left(address),
                                    address, secret_name)
    except OSError as e:
        s.close()
        if isinstance(e, _worker_auth.WorkerAuthError):
            raise
        left(address)  # raises when the barrier's time is up; else it was the connection's own failure
        raise
    except BaseException:
        s.close()
        raise
    try:
        answer = json.loads(line or b"{}")
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        s.close()
        raise RuntimeError(f"{address} did not answer as a monarch worker does (it answered "
                           f"{line[:60]!r}): is a worker loop (run_worker_loop_forever) serving there?")
    if "addr" not in answer:
        s.close()
        raise RuntimeError(f"worker {address} did not start a host agent: {answer.get('error', 'no answer')}")
    s.settimeout(None)
    _links[answer["addr"]] = session
    refs.append(HostRef(answer["addr"], answer.get("host", host), rank))


def release_workers(addrs: Sequence[str]) -> None:
    """The client shut these workers' host mesh down: each worker stops its agent (and, under
    ``run_worker_loop_until_shutdown``, returns)."""
    for a in addrs:
        session = _links.pop(a, None)
        if session is not None:
            try:
                session.conn.sendall(session.shutdown_line())
            except OSError:
                pass
            session.conn.close()


# --- bootstrap commands ---------------------------------------------------------------------------


@dataclass
class BootstrapCommand:
    """How a proc is started: program, arguments, environment (Monarch's ``BootstrapCommand``).

    ``env`` entries set to ``None`` by :meth:`with_env` remove a variable; ``inherit_env=False``
    starts from an empty environment.  monarch's procs are forked from a warm interpreter of the
    host agent; a mesh made with ``HostMesh.with_python_executable(exe)`` runs ``exe`` instead.
    """

    program: str
    arg0: Optional[str] = None
    args: list[str] = field(default_factory=list)
    env: dict[str, Optional[str]] = field(default_factory=dict)
    inherit_env: bool = True

    def with_env(self, env: dict[str, Optional[str]]) -> "BootstrapCommand":
        return BootstrapCommand(self.program, self.arg0, list(self.args), {**self.env, **env}, self.inherit_env)

    def __str__(self) -> str:
        return shlex.join([self.program, *self.args])


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command procs start with here: this interpreter running monarch's proc entry point."""
    return BootstrapCommand(sys.executable, None, ["-m", "monarch_agents.zygote"], {})


# --- the client's lifetime ------------------------------------------------------------------------


_shutdown: Future | None = None


def shutdown_context(host_timeout: float | None = None) -> Future:
    """Shut this process's monarch client down: the procs of ``this_host()`` stop, then its runtimes
    close (and the enrollment connections of :func:`attach_to_workers`, and the gateway of :func:`attach`).  Later calls return a done
    future; the program itself goes on.  A process without a client gets a done future."""
    global _shutdown
    if host_timeout is not None and not (0 <= host_timeout < 2**64):
        raise ValueError(f"host_timeout must be finite and non-negative, got {host_timeout!r}")
    from monarch_agents import runtime as rt_mod

    if _shutdown is not None or rt_mod.current() is None:
        return Future.completed(None)
    fut: Future = Future()
    _shutdown = fut
    try:
        from monarch.actor import _client
        from monarch_agents.client import close_runtime

        # The client's last telemetry rows reach their jobs, and its pushing thread ends, while
        # the runtimes are still open.
        from monarch.actor import _telemetry

        _telemetry.stop()
        _client._stop_local_host()
        for session in _links.values():
            session.conn.close()
        _links.clear()
        close_runtime()
        if _gateway_of_client is not None:
            _gateway_of_client.close()  # its duplex, proxy and control socket (the client stays attached)
        fut.set_result(None)
    except BaseException as e:  # noqa: BLE001
        fut.set_exception(e)
    return fut


#: The gateway this client was attached through (:func:`attach`), if any.
_gateway_of_client: Any = None
_attach_lock = threading.Lock()


def attach(addr: str) -> None:
    """Bootstrap this process's client through the worker loop serving at ``addr`` (``tcp://HOST:PORT``
    or ``ipc://PATH``): its connections go through that worker, and its peers reach it there, so the
    client need not be reachable from the workers' network (see ``monarch/actor/_gateway.py``).

    Call it before the client's first ``context()``/``this_host()``/``this_proc()``; again with the
    same address it does nothing.  The worker and this client prove this user's worker secret to each
    other first (as ``attach_to_workers`` does), on every connection."""
    global _gateway_of_client
    from monarch.actor import _gateway
    from monarch.actor._client import ensure_runtime
    from monarch_agents import runtime as rt_mod
    from monarch_agents.keys import JobKeys

    with _attach_lock:
        if _gateway_of_client is not None:
            if _gateway_of_client.address == addr:
                return
            raise RuntimeError(f"client is already attached through {_gateway_of_client.address}, not {addr}; "
                               "detaching is not supported, so use a new process to attach through a different "
                               "address")
        if rt_mod.current() is not None:
            raise RuntimeError("client was initialized without a remote attachment; call attach(addr) before "
                               "the first context()/this_host()/this_proc()")
        if not isinstance(addr, str) or not (addr.startswith("ipc://") or addr.startswith("tcp://")):
            raise ValueError(f"attach takes a worker's address (tcp://HOST:PORT or ipc://PATH), got {addr!r}")
        if _ipc_path(addr) is None:
            _parse(addr)  # a malformed address fails here, with its reason
        gw = _gateway.Gateway(addr, _worker_auth.load_secret(), _worker_auth.secret_path())
        keys = JobKeys.generate()
        gw.admit(keys)
        try:
            ensure_runtime(keys, route=gw.route())
        except BaseException:
            gw.close()
            raise
        _gateway_of_client = gw


# --- hosts_from_config ----------------------------------------------------------------------------


def _serve_once(info_fd: int) -> None:
    """A worker of :func:`hosts_from_config`: read the one-time secret its client made from stdin,
    listen on a free loopback port, say which on ``info_fd``, serve the one client that proves that
    secret, then exit."""
    secret = sys.stdin.buffer.readline().strip()
    if len(secret) < 32:
        raise SystemExit("monarch worker: no secret on stdin")
    listener, host = _listen("tcp://127.0.0.1:0")
    worker = _Worker(listener, secret, host)
    worker.start()
    with os.fdopen(info_fd, "w") as f:
        f.write(f"tcp://127.0.0.1:{listener.getsockname()[1]}\n")
    # Its client attaches at once; one that never does (it failed first) must not leave this waiting.
    try:
        _serve_one(worker.next(timeout=_ENROLL_TIMEOUT_S), host)
    except queue.Empty:
        pass
    finally:
        worker.close()


def hosts_from_config(name: str) -> Any:
    """The host mesh ``name`` of this project's configuration: as in Monarch today, two workers
    started on this machine and attached (a ``HostMesh({hosts: 2})``).  The workers end when this
    client leaves them (its exit, or the mesh's ``shutdown()``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"hosts_from_config takes a mesh name, got {name!r}")
    from monarch.actor._client import _pythonpath

    # These workers serve this client only: a secret made for them, handed over their stdin.
    secret = os.urandom(32).hex().encode()
    workers = []
    for _ in range(2):
        r, w = os.pipe()
        p = subprocess.Popen([sys.executable, "-c", f"from monarch.actor._bootstrap import _serve_once; _serve_once({w})"],
                             stdin=subprocess.PIPE, pass_fds=(w,), start_new_session=True,
                             env={**os.environ, "PYTHONPATH": _pythonpath()})
        os.close(w)
        assert p.stdin is not None
        p.stdin.write(secret + b"\n")
        p.stdin.close()
        with os.fdopen(r) as f:
            addr = f.readline().strip()
        if not addr:
            raise RuntimeError(f"a worker for host mesh {name!r} did not start")
        workers.append(addr)
    return _attach(workers, name, secret, "the secret of hosts_from_config's workers")
