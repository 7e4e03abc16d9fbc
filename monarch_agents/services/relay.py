"""The client's stand-in inside the cluster, for a client that reaches its hosts only through
port-forward streams (see ``monarch_agents.tunnel``).

Runs in the agent started with ``--relay-port`` (the Kubernetes scheduler gives it to host rank
0).  A request line on that port is one of:

* ``{"token": T, "listen": true}``: the connection becomes a control stream for one client
  process.  The relay listens on a new port of this host and answers ``{"port": P}``; that
  ``host:P`` is the address the client gives its peers.  Each connection a peer makes to it is
  announced as ``{"conn": N}``; when the control stream ends, the port is closed.
* ``{"token": T, "accept": N}``: the client's stream for announced connection ``N``; bytes flow
  between the two until either end closes.

A request without the right token is dropped without an answer.  Connections announced but not
accepted within ``_ACCEPT_WAIT_S`` are closed.
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
            threading.Thread(target=self._serve, args=(ls,), name="relay", daemon=True).start()

    def _listen(self, port: int) -> socket.socket:
        ls = socket.create_server((self.agent.rt.mailbox.bind_host, port), backlog=64)
        with self._lock:
            self._listeners.append(ls)
        return ls

    def info(self) -> dict:
        if self.error:
            return {"port": self.port, "error": self.error}
        return {"port": self.port, "clients": self.clients, "tunnels": self.tunnels, "shed": self._unproven.shed} if self.port else {}

    def stop(self, deadline: float) -> None:
        with self._lock:
            self._closed = True
            listeners, self._listeners = self._listeners, []
            pending, self._pending = self._pending, {}
        for s in [*listeners, *(c for c, _ in pending.values())]:
            _close(s)
        self._unproven.shut_all()

    # -- the relay port --------------------------------------------------------

    def _serve(self, ls: socket.socket) -> None:
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return  # closed by stop()
            self._unproven.admit(conn)
            threading.Thread(target=self._request, args=(conn,), name="relay-request", daemon=True).start()

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
            self._control(conn)
        elif isinstance(req.get("accept"), int):
            with self._lock:
                peer = self._pending.pop(req["accept"], (None, 0))[0]
            if peer is None:
                return _close(conn)
            self.tunnels += 1
            tunnel.pipe(peer, conn, name="relay")
        else:
            _close(conn)

    def _control(self, control: socket.socket) -> None:
        """One client process: a port standing for it, until its control stream ends."""
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
                    self._expire()
                    self._pending[n] = (conn, time.monotonic())
                try:
                    with lock:
                        tunnel.send_line(control, {"conn": n})
                except OSError:
                    return _close(conn)

        try:
            tunnel.send_line(control, {"port": ls.getsockname()[1]})
            threading.Thread(target=announce, name="relay-announce", daemon=True).start()
            while control.recv(4096):  # the client sends nothing more; its end is the end
                pass
        except OSError:
            pass
        finally:
            with self._lock:
                if ls in self._listeners:
                    self._listeners.remove(ls)
            _close(ls)
            _close(control)
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
