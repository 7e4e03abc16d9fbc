"""The client's stand-in inside the cluster, for a client that reaches its hosts only through
port-forward streams (see ``monarch_agents.tunnel``).

Runs in the agent started with ``--relay-port`` (the Kubernetes scheduler gives it to host rank
0).  A request line on that port is one of:

* ``{"token": T, "listen": true}``: the connection becomes a control stream for one client
  process.  The relay listens on a new port of this host and answers ``{"port": P}``; that
  ``host:P`` is the address the client gives its peers.  Each connection a peer makes to it is
  announced as ``{"conn": N}``; when the control stream ends, the port is closed.  With
  ``"heartbeat": H`` (seconds) the client promises a byte at least every H s on that stream: one
  silent for ``_MISSED_BEATS`` times that is a client gone without closing (a port-forward whose
  far end vanished keeps the pod's end of the stream open), and its port is closed as if it had
  ended.  Every control stream has TCP keepalive too, for a peer that is gone with its host.
* ``{"token": T, "accept": N}``: the client's stream for announced connection ``N``; bytes flow
  between the two until either end closes.

A request without the right token is dropped without an answer.  Connections announced but not
accepted within ``_ACCEPT_WAIT_S`` are closed.  ``stop()`` closes every socket the relay holds
(listeners, control streams, tunnels) and joins its threads by the deadline it is given.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import socket
import threading
import time

from monarch_agents import tunnel
from monarch_agents.services import Service
from monarch_agents.unproven import UnprovenConnections

log = logging.getLogger("monarch.relay")

_ACCEPT_WAIT_S = 10.0
#: At most this many connections wait to show the token at once; one more closes the oldest (a
#: flood of idle connections from anyone who can reach the port must not grow threads without bound,
#: nor keep the client out by holding every slot).
_UNPROVEN_MAX = 16
#: A connection has this long, in all, to send its request line with the token.
_REQUEST_DEADLINE_S = 5.0
#: A control stream with a heartbeat is a vanished client after this many beats without a byte.
_MISSED_BEATS = 4
#: The longest heartbeat taken (a larger one would keep a vanished client's port for hours).
_MAX_HEARTBEAT_S = 300.0
#: TCP keepalive of a control stream: first probe after this much silence, then every
#: _KEEPALIVE_INTERVAL_S, the peer gone after _KEEPALIVE_COUNT unanswered.
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_COUNT = 30, 10, 3


class RelayService(Service):
    name = "relay"

    def __init__(self, agent):
        super().__init__(agent)
        self.port = getattr(agent, "relay_port", 0)
        self._token = tunnel.token(agent.keys)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[socket.socket, float]] = {}
        self._lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        #: Control streams and tunnel ends in use: stop() shuts them (a thread blocked in recv()
        #: on one wakes only by shutdown(), not by close()).
        self._live: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        #: Connections yet to show the token (one more closes the oldest: a stranger's idle
        #: connections neither exhaust the agent nor keep the client out).
        self._unproven = UnprovenConnections(_UNPROVEN_MAX)
        self.clients = 0
        self.tunnels = 0
        #: Why the relay is not listening ("" while it is, or when it was not asked for).
        self.error = ""
        if self.port:
            try:
                ls = self._listen(self.port)
            except OSError as e:
                # The agent still serves clients that reach it directly; one behind a port-forward
                # is told the relay does not answer, and this says why.
                self.error = f"cannot listen on port {self.port}: {e.strerror or e}"
                log.warning("relay: %s", self.error)
                return
            self._spawn(self._serve, (ls,), "relay")

    def _listen(self, port: int) -> socket.socket:
        ls = socket.create_server((self.agent.rt.mailbox.bind_host, port), backlog=64)
        with self._lock:
            if self._closed:  # stop() came first: nothing new listens
                ls.close()
                raise OSError("the relay is stopped")
            self._listeners.append(ls)
        return ls

    def _spawn(self, target, args: tuple, name: str) -> bool:
        """Run ``target`` on a thread stop() joins; none (False) once stop() has run: it would join no more."""
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            if self._closed:
                return False
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()  # under the lock: stop() sees every thread started before it
        return True

    def _hold(self, *socks: socket.socket) -> bool:
        """Sockets stop() shuts; False (and they are closed) once stop() has run."""
        with self._lock:
            if not self._closed:
                self._live = {x for x in self._live if x.fileno() != -1}
                self._live.update(socks)
                return True
        for x in socks:
            _close(x)
        return False

    def info(self) -> dict:
        if self.error:
            return {"port": self.port, "error": self.error}
        return {"port": self.port, "clients": self.clients, "tunnels": self.tunnels, "shed": self._unproven.shed} if self.port else {}

    def stop(self, deadline: float) -> None:
        with self._lock:
            self._closed = True
            listeners, self._listeners = self._listeners, []
            pending, self._pending = self._pending, {}
            live, self._live = list(self._live), set()
            threads = list(self._threads)
        for s in [*listeners, *(c for c, _ in pending.values()), *live]:
            _shut(s)
        self._unproven.shut_all()
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))

    # -- the relay port --------------------------------------------------------

    def _serve(self, ls: socket.socket) -> None:
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return  # closed by stop()
            self._unproven.admit(conn)
            if not self._spawn(self._request, (conn,), "relay-request"):
                self._unproven.proven(conn)
                return _close(conn)  # came as the relay stopped

    def _request(self, conn: socket.socket) -> None:
        try:
            try:
                req = tunnel.read_line(conn, deadline=time.monotonic() + _REQUEST_DEADLINE_S)
            except OSError:
                req = None
            if req is None or not hmac.compare_digest(str(req.get("token", "")), self._token):
                log.info("relay: dropped a connection without the job's token")
                return _close(conn)
        finally:
            self._unproven.proven(conn)  # proven (or gone): its slot is free for the next one
        conn.settimeout(None)
        if req.get("listen"):
            self._control(conn, req.get("heartbeat"))
        elif isinstance(req.get("accept"), int):
            with self._lock:
                peer = self._pending.pop(req["accept"], (None, 0))[0]
            if peer is None:
                return _close(conn)
            if not self._hold(peer, conn):
                return
            self.tunnels += 1
            tunnel.pipe(peer, conn, name="relay")
        else:
            _close(conn)

    def _control(self, control: socket.socket, heartbeat: object = None) -> None:
        """One client process: a port standing for it, until its control stream ends, stays silent
        past its heartbeat, or the relay stops."""
        if not self._hold(control):
            return
        _keepalive(control)
        if isinstance(heartbeat, (int, float)) and not isinstance(heartbeat, bool) and heartbeat > 0:
            control.settimeout(_MISSED_BEATS * min(float(heartbeat), _MAX_HEARTBEAT_S))
        try:
            ls = self._listen(0)
        except OSError as e:
            return _close(control) or log.warning("relay: cannot listen for a client: %s", e)
        self.clients += 1
        lock = threading.Lock()

        def announce() -> None:
            while True:
                try:
                    conn, _ = ls.accept()
                except OSError:
                    return
                n = next(self._ids)
                with self._lock:
                    if self._closed:  # stop() has taken the pending ones already
                        return _close(conn)
                    self._expire()
                    self._pending[n] = (conn, time.monotonic())
                try:
                    with lock:
                        tunnel.send_line(control, {"conn": n})
                except OSError:
                    return _close(conn)

        try:
            tunnel.send_line(control, {"port": ls.getsockname()[1]})
            self._spawn(announce, (), "relay-announce")
            # The client sends only heartbeats (if it said so); its end, or its silence, is the end.
            while control.recv(4096):
                pass
        except socket.timeout:
            log.info("relay: a client sent no heartbeat for %.0f s: gone without closing; its port is closed",
                     control.gettimeout() or 0)
        except OSError:
            pass
        finally:
            with self._lock:
                if ls in self._listeners:
                    self._listeners.remove(ls)
            _shut(ls)  # wakes announce() in accept()
            _shut(control)
            self.clients -= 1

    def _expire(self) -> None:
        now = time.monotonic()
        for n, (conn, at) in list(self._pending.items()):
            if now - at > _ACCEPT_WAIT_S:
                del self._pending[n]
                _close(conn)


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass


def _shut(s: socket.socket) -> None:
    """Close ``s``, waking a thread blocked on it in accept() or recv() (close() alone does not)."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already, or never connected
    _close(s)


def _keepalive(s: socket.socket) -> None:
    """TCP keepalive on ``s``: a peer whose host is gone is noticed in about a minute, not never."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
                           ("TCP_KEEPCNT", _KEEPALIVE_COUNT)):
            if hasattr(socket, opt):
                s.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    except OSError:
        pass  # not TCP (a test's socketpair): nothing to probe
