"""Monarch's ``attach(addr)``: a client that reaches its workers, and is reached by them, only
through one worker loop's address.

``attach("tcp://worker0:4444")`` (or ``ipc://PATH``), before the client's first ``context()``,
``this_host()`` or ``this_proc()``, bootstraps the client's runtime through the worker loop
serving there (``run_worker_loop_forever``):

* ``attach`` opens one connection to the worker (the *duplex*), after both ends prove this user's
  worker secret (``monarch/actor/_worker_auth.py``, as ``attach_to_workers`` does: another local
  user who reaches the address gets a one-line refusal and nothing else).  Everything below is a
  stream multiplexed over it (:class:`Mux`); the worker's address is never dialled again;
* every connection the client's runtime opens (to the host agents of workers it attaches, to their
  procs) goes to a SOCKS5 proxy of this process, on loopback, whose password is its job's relay
  token (``monarch_agents.tunnel.token``: only the client's runtimes, and helper processes holding
  its keys, know it); the worker opens the connection on its side and the bytes go over the duplex;
* the client's address, as its peers know it, is a port the worker listens on for it: each
  connection made there comes back over the duplex to the client's own endpoint (asked for on the
  control socket of ``monarch_agents.client``'s ``route``, a 0600 Unix socket in a 0700 folder).

What is carried is CURVE ciphertext end to end.  A worker serves a duplex beside its one client at
a time; when the duplex closes, every stream and port of it goes.

Workers attached afterwards (``attach_to_workers``, a ``ProcessJob`` of workers) take the attached
client's keys, not keys of their own, so that procs of ``this_host()`` and procs on those workers
call each other as procs of one job (Monarch's one transport); a reservation made by ``monarch
serve`` keeps its own keys and route.  Where we differ: ``this_host()``'s procs are reached through
the gateway too, so the worker must reach this machine's loopback (a worker on this machine, an
``ipc://`` address); Monarch routes them back over its duplex.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import socket
import struct
import tempfile
import threading
import time
from typing import Any, Callable

from monarch.actor import _worker_auth
from monarch_agents import tunnel
from monarch_agents.debug_rank import recv_exact
from monarch_agents.files import private_dir, runtime_dir

log = logging.getLogger("monarch.actor")

#: How long the duplex has to authenticate, and a stream to be opened.
_OPEN_S = 10.0
#: Streams of one duplex, at most (a flood of connections to the client's port holds no more).
_STREAMS_MAX = 4096

# Frames: stream id, kind, payload length; then the payload.
_HEAD = struct.Struct("!IBI")
_MAX_PAYLOAD = 1 << 20
DATA, EOF, CONNECT, OK, FAIL, LISTEN, LISTENING, INCOMING, UNLISTEN = range(9)


# --- one connection, many streams ------------------------------------------------------------------


class Mux:
    """Streams over one connection: each a local socket whose bytes go both ways as frames.

    One reader thread hands frames to their streams in order (``on_frame`` gets the others); each
    stream has a thread that reads its socket and sends frames.  A stream's end each way is an EOF
    frame (the other side shuts its socket's writing); a stream ends when both ways have."""

    def __init__(self, conn: socket.socket, first_id: int, on_frame: Callable[[int, int, bytes], None]):
        self.conn = conn
        self._ids = itertools.count(first_id, 2)  # the client's odd, the worker's even: never the same
        self._on_frame = on_frame
        self._wlock = threading.Lock()
        self._lock = threading.Lock()
        self._streams: dict[int, socket.socket] = {}
        self._halves: dict[int, int] = {}
        self.closed = threading.Event()

    def new_id(self) -> int:
        return next(self._ids)

    def send(self, sid: int, kind: int, payload: bytes = b"") -> None:
        with self._wlock:
            self.conn.sendall(_HEAD.pack(sid, kind, len(payload)) + payload)

    def add(self, sid: int, sock: socket.socket, then: Callable[[], None] | None = None) -> bool:
        """Carry ``sock`` as stream ``sid`` from now on (False, and closed, if the duplex is full or gone).

        ``then`` runs once frames for ``sid`` reach ``sock`` and before any of ``sock``'s bytes are sent:
        where the peer learns of the stream from a frame (``OK``, ``INCOMING``), that frame is sent
        there, so that neither side's first bytes can overtake it or come before the stream exists."""
        with self._lock:
            if self.closed.is_set() or len(self._streams) >= _STREAMS_MAX:
                _close(sock)
                return False
            self._streams[sid] = sock
            self._halves[sid] = 0
        sock.settimeout(None)
        if then is not None:
            try:
                then()
            except OSError:
                self._drop(sid)
                return False
        threading.Thread(target=self._pump, args=(sid, sock), name="gateway-stream", daemon=True).start()
        return True

    def _drop(self, sid: int) -> None:
        with self._lock:
            self._halves.pop(sid, None)
            sock = self._streams.pop(sid, None)
        if sock is not None:
            _close(sock)

    def _pump(self, sid: int, sock: socket.socket) -> None:
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                self.send(sid, DATA, data)
        except OSError:
            pass
        try:
            self.send(sid, EOF)
        except OSError:
            pass
        self._half_done(sid)

    def _half_done(self, sid: int) -> None:
        with self._lock:
            n = self._halves.get(sid)
            if n is None:
                return
            if n == 0:
                self._halves[sid] = 1
                return
            del self._halves[sid]
            sock = self._streams.pop(sid, None)
        if sock is not None:
            _close(sock)

    def run(self) -> None:
        """Read frames until the connection ends; then end every stream."""
        try:
            while True:
                head = recv_exact(self.conn, _HEAD.size)
                if head is None:
                    break
                sid, kind, n = _HEAD.unpack(head)
                if n > _MAX_PAYLOAD:
                    break  # not our peer's framing
                payload = recv_exact(self.conn, n) if n else b""
                if payload is None:
                    break
                if kind == DATA:
                    sock = self._streams.get(sid)
                    if sock is not None:
                        try:
                            sock.sendall(payload)
                        except OSError:
                            pass  # that stream's socket is gone; its reader sends EOF
                elif kind == EOF:
                    sock = self._streams.get(sid)
                    if sock is not None:
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_WR)
                        self._half_done(sid)
                else:
                    self._on_frame(sid, kind, payload)
        except OSError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            self.closed.set()
            streams, self._streams = self._streams, {}
            self._halves.clear()
        for s in [self.conn, *streams.values()]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            _close(s)


def _json(payload: bytes) -> dict:
    try:
        value = json.loads(payload)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# --- the worker's side ----------------------------------------------------------------------------


class WorkerGateway:
    """What a worker loop does for clients attached through it (one per loop, beside its client queue)."""

    def __init__(self, bind_host: str):
        self.bind_host = bind_host
        self._lock = threading.Lock()
        self._muxes: set[Mux] = set()
        self._closed = False

    def serve(self, session: "_worker_auth.Session") -> None:
        """One authenticated connection whose request is ``{"gateway": "duplex"}`` (on its own thread)."""
        conn = session.conn
        if session.request.get("gateway") != "duplex":
            with contextlib.suppress(OSError):
                session.answer(json.dumps({"error": f"unknown gateway request {session.request.get('gateway')!r}"})
                               .encode())
            return _close(conn)
        listeners: dict[int, socket.socket] = {}
        mux = Mux(conn, 2, lambda sid, kind, payload: self._frame(mux, listeners, sid, kind, payload))
        with self._lock:
            if self._closed:
                return _close(conn)
            self._muxes.add(mux)
        try:
            session.answer(json.dumps({"gateway": 1}).encode())
            conn.settimeout(None)
            mux.run()
        except OSError:
            pass
        finally:
            mux.close()
            for ls in list(listeners.values()):
                _close_listener(ls)
            with self._lock:
                self._muxes.discard(mux)

    def _frame(self, mux: Mux, listeners: dict, sid: int, kind: int, payload: bytes) -> None:
        if kind == CONNECT:
            req = _json(payload)
            threading.Thread(target=self._connect, args=(mux, sid, req.get("host"), req.get("port")),
                             name="gateway-connect", daemon=True).start()
        elif kind == LISTEN:
            try:
                ls = socket.create_server((self.bind_host, 0), family=_family(self.bind_host), backlog=64)
            except OSError as e:
                return mux.send(sid, FAIL, json.dumps({"error": f"cannot listen: {e.strerror or e}"}).encode())
            listeners[sid] = ls
            mux.send(sid, LISTENING, json.dumps({"host": self.bind_host, "port": ls.getsockname()[1]}).encode())
            threading.Thread(target=self._announce, args=(mux, sid, ls), name="gateway-listen", daemon=True).start()
        elif kind == UNLISTEN:
            ls = listeners.pop(sid, None)
            if ls is not None:
                _close_listener(ls)

    @staticmethod
    def _connect(mux: Mux, sid: int, host: Any, port: Any) -> None:
        if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536:
            return mux.send(sid, FAIL, b'{"error": "connect needs a host and a port"}')
        try:
            out = socket.create_connection((host, port), timeout=_OPEN_S)
        except OSError as e:
            with contextlib.suppress(OSError):
                mux.send(sid, FAIL, json.dumps({"error": f"cannot connect to {host}:{port}: {e.strerror or e}"})
                         .encode())
            return
        mux.add(sid, out, then=lambda: mux.send(sid, OK))

    @staticmethod
    def _announce(mux: Mux, lid: int, ls: socket.socket) -> None:
        """Each connection a peer makes to the client's port: a stream the client takes to its endpoint."""
        while True:
            try:
                peer, _ = ls.accept()
            except OSError:
                return
            sid = mux.new_id()
            # Announced before any of its bytes (the client connects its end as it reads this), and once
            # the client's bytes for it have somewhere to go.
            announce = json.dumps({"listen": lid}).encode()
            if not mux.add(sid, peer, then=functools.partial(mux.send, sid, INCOMING, announce)):
                if mux.closed.is_set():
                    return

    def close(self) -> None:
        with self._lock:
            self._closed = True
            muxes, self._muxes = self._muxes, set()
        for m in muxes:
            m.close()


# --- the client's side ----------------------------------------------------------------------------


class Gateway:
    """This client's way to and from its workers through the worker loop at ``address``."""

    def __init__(self, address: str, secret: bytes, secret_name: str):
        self.address = address
        self._tokens: set[str] = set()
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[socket.socket | None, list]] = {}  # sid -> (SOCKS conn, [answer, event])
        self._listens: dict[int, tuple[str, int]] = {}  # listen id -> the runtime's endpoint
        conn = self._dial(address)
        try:
            line, _ = _worker_auth.connect(conn, secret, {"gateway": "duplex"}, time.monotonic() + _OPEN_S, address,
                                           secret_name)
        except BaseException:
            conn.close()
            raise
        answer = _json(line)
        if answer.get("gateway") != 1:
            conn.close()
            raise RuntimeError(f"worker {address} does not serve as a gateway: {answer.get('error', line[:60])}")
        conn.settimeout(None)
        self.mux = Mux(conn, 1, self._frame)
        threading.Thread(target=self.mux.run, name="gateway-duplex", daemon=True).start()
        self._dir = tempfile.mkdtemp(prefix="gateway-", dir=private_dir(runtime_dir()))
        self.control_path = os.path.join(self._dir, "control.sock")
        self._control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._control.bind(self.control_path)
        finally:
            os.umask(old)
        self._control.listen(16)
        self._socks = socket.create_server(("127.0.0.1", 0), backlog=64)
        for ls, handle, name in ((self._socks, self._socks_conn, "gateway-socks"),
                                 (self._control, self._control_conn, "gateway-control")):
            threading.Thread(target=self._serve, args=(ls, handle, name), name=name, daemon=True).start()

    @staticmethod
    def _dial(address: str) -> socket.socket:
        """Connect to the worker, waiting for one still starting (as ``attach_to_workers`` does) for
        ``mesh_attach_config_timeout``."""
        from monarch import config as _config
        from monarch.actor._bootstrap import _connect_when_up, _dial_address

        limit = _config.seconds("mesh_attach_config_timeout")
        deadline = time.monotonic() + limit

        def left(_: str) -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"worker {address} did not answer within mesh_attach_config_timeout ({limit:g} s)")
            return remaining

        host, port = _dial_address(address)
        return _connect_when_up(host, port, address, left)

    def route(self) -> dict:
        """How a runtime goes through this gateway (``monarch_agents.client.ensure_runtime``'s ``route``)."""
        return {"via": "port-forward", "socks": f"127.0.0.1:{self._socks.getsockname()[1]}",
                "control": self.control_path, "gateway": self.address}

    def admit(self, keys: Any) -> None:
        """Let the runtimes of ``keys``'s job use this gateway's SOCKS proxy."""
        self._tokens.add(tunnel.token(keys))

    def close(self) -> None:
        for s in (self._socks, self._control):
            _close_listener(s)
        self.mux.close()
        with contextlib.suppress(OSError):
            os.unlink(self.control_path)
            os.rmdir(self._dir)

    # -- frames from the worker (the duplex's reader thread) ---------------------------------------

    def _frame(self, sid: int, kind: int, payload: bytes) -> None:
        if kind in (OK, FAIL, LISTENING):
            with self._lock:
                conn, waiter = self._pending.pop(sid, (None, None))
            if waiter is None:
                return
            if kind == OK and conn is not None:
                # Granted before the stream's first bytes can come (they are read after this frame).
                try:
                    tunnel.socks5_granted(conn)
                except OSError:
                    _close(conn)
                else:
                    self.mux.add(sid, conn)
            waiter[0] = (kind, _json(payload))
            waiter[1].set()
        elif kind == INCOMING:
            lid = _json(payload).get("listen")
            local = self._listens.get(lid) if isinstance(lid, int) else None
            try:
                if local is None:
                    raise OSError("no such listener")
                mine = socket.create_connection(local, timeout=_OPEN_S)
            except OSError:
                with contextlib.suppress(OSError):
                    self.mux.send(sid, EOF)
                return
            self.mux.add(sid, mine)

    def _ask(self, kind: int, request: dict, conn: socket.socket | None = None) -> tuple[int, int, dict]:
        """Send a request frame on a new stream; (stream id, answer kind, answer) once the worker answers."""
        sid = self.mux.new_id()
        waiter: list = [None, threading.Event()]
        with self._lock:
            self._pending[sid] = (conn, waiter)
        self.mux.send(sid, kind, json.dumps(request).encode())
        if not waiter[1].wait(_OPEN_S + 5) or waiter[0] is None:
            with self._lock:
                self._pending.pop(sid, None)
            raise TimeoutError(f"the gateway {self.address} did not answer")
        return sid, waiter[0][0], waiter[0][1]

    # -- what this process's runtimes ask of it ---------------------------------------------------

    @staticmethod
    def _serve(ls: socket.socket, handle: Any, name: str) -> None:
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return  # closed
            threading.Thread(target=handle, args=(conn,), name=name, daemon=True).start()

    def _socks_conn(self, conn: socket.socket) -> None:
        """One SOCKS5 connection of a runtime: a stream through the duplex to where it asks."""
        try:
            target = tunnel.socks5_accept(conn, lambda password: any(
                tunnel.same_token(password, t) for t in list(self._tokens)))
            if target is None:
                return
            host, port = target
            try:
                _, kind, answer = self._ask(CONNECT, {"host": host, "port": port}, conn)
            except (OSError, TimeoutError) as e:
                log.warning("gateway %s: cannot open a stream to %s:%d: %s", self.address, host, port, e)
                return tunnel.socks5_refuse(conn, 5)
            if kind != OK:
                log.warning("gateway %s: %s", self.address, answer.get("error", answer))
                return tunnel.socks5_refuse(conn, 5)
        except (OSError, ValueError, struct.error):
            _close(conn)

    def _control_conn(self, conn: socket.socket) -> None:
        """A runtime asks for an address, on the worker's network, that reaches its ``local`` endpoint;
        it stays valid while this connection stays open."""
        lid = None
        try:
            req = tunnel.read_line(conn, deadline=time.monotonic() + _OPEN_S)
            if req is None or not isinstance(req.get("local"), str):
                return _close(conn)
            host, _, port = req["local"].rpartition(":")
            local = (host.strip("[]"), int(port))
            try:
                lid, kind, answer = self._ask(LISTEN, {})
            except (OSError, TimeoutError) as e:
                return tunnel.send_line(conn, {"error": f"the gateway {self.address} does not answer: {e}"})
            if kind != LISTENING:
                return tunnel.send_line(conn, {"error": str(answer.get("error", answer))})
            self._listens[lid] = local
            h = answer["host"]
            tunnel.send_line(conn, {"advertise": f"tcp://[{h}]:{answer['port']}" if ":" in h
                                    else f"tcp://{h}:{answer['port']}"})
            conn.settimeout(None)
            while conn.recv(4096):  # the runtime sends nothing more: its end is the end
                pass
        except (OSError, ValueError):
            pass
        finally:
            _close(conn)
            if lid is not None:
                self._listens.pop(lid, None)
                with contextlib.suppress(OSError):
                    self.mux.send(lid, UNLISTEN)


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _close_listener(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)  # wakes its accepting thread (a close alone does not)
    _close(s)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.close()
