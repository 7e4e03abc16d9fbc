"""Byte tunnels for a client that cannot reach its hosts' addresses (Kubernetes port-forward).

A client outside a Kubernetes cluster reaches pods only through connections it opens itself
(port-forward streams through the API server); the pods cannot dial it back.  Two pieces close
that gap without changing how monarch processes address each other:

* the client side (``monarch_schedulers.kube_forward``) forwards each connection the client
  opens to a pod address, through a port-forward stream;
* the pod side (``monarch_agents.services.relay``, in host rank 0's agent) listens, in the
  cluster, on an address that stands for the client, and hands every connection made to it
  back to the client through a stream the client opened.

Both speak one JSON line per request on a fresh TCP connection, then carry raw bytes: the
traffic inside is ZeroMQ with CURVE end to end, so a tunnel sees only ciphertext.  A request
carries :func:`token`, which only holders of the host agents' secret key can make: user code in
a proc (which holds no such key) cannot open listeners on the relay.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
import threading
from typing import Callable

from monarch_agents.keys import JobKeys

#: The longest request line either side reads (a request is a few dozen bytes).
MAX_LINE = 4096
#: How often a client sends a byte on its relay control stream (see ``services.relay``).
HEARTBEAT_S = 15.0


def token(keys: JobKeys) -> str:
    """What proves a relay request comes from the job's client."""
    return hmac.new(keys.host_secret.encode(), b"monarch-relay-v1", hashlib.sha256).hexdigest()


def send_line(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def read_line(sock: socket.socket, deadline: float | None = None) -> dict | None:
    """One JSON line, read a byte at a time so no tunnelled byte after it is consumed; None at EOF.

    ``deadline`` (``time.monotonic()``): the whole line must have come by then (a peer sending a
    byte now and then cannot hold the reader), else ``socket.timeout``."""
    import time

    buf = bytearray()
    while len(buf) < MAX_LINE:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the request line did not come in time")
            sock.settimeout(left)
        b = sock.recv(1)
        if not b:
            return None
        if b == b"\n":
            try:
                obj = json.loads(buf)
            except ValueError:
                return None
            return obj if isinstance(obj, dict) else None
        buf += b
    return None


def pipe(a: socket.socket, b: socket.socket, name: str = "tunnel") -> threading.Thread:
    """Carry bytes both ways between ``a`` and ``b`` until both directions end; then close both.

    Runs on two daemon threads; returns the one to join.
    """
    def one_way(src: socket.socket, dst: socket.socket, done: threading.Event) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        done.set()

    a_done, b_done = threading.Event(), threading.Event()

    def closer() -> None:
        one_way(a, b, a_done)
        b_done.wait()
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass

    threading.Thread(target=one_way, args=(b, a, b_done), name=f"{name}-back", daemon=True).start()
    t = threading.Thread(target=closer, name=f"{name}-fwd", daemon=True)
    t.start()
    return t


def same_token(given: str, token_: str) -> bool:
    """Whether ``given`` is ``token_`` (in constant time)."""
    return hmac.compare_digest(given.encode(), token_.encode())


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed mid-request")
        buf += chunk
    return buf


def socks5_accept(conn: socket.socket, password_ok: "Callable[[str], bool]",
                  timeout: float = 10.0) -> tuple[str, int] | None:
    """A SOCKS5 CONNECT request (RFC 1928) with username/password (RFC 1929), on a proxy that loopback
    shares with every user of the machine: ``(host, port)`` once the password is one ``password_ok``
    takes, else None (the connection refused and closed).  Answer it with :func:`socks5_granted` or
    :func:`socks5_refuse`."""
    import ipaddress

    conn.settimeout(timeout)
    ver, n = _recv_exact(conn, 2)
    methods = _recv_exact(conn, n)
    if ver != 5 or 2 not in methods:
        conn.sendall(b"\x05\xff")  # username/password or nothing
        conn.close()
        return None
    conn.sendall(b"\x05\x02")
    _, ulen = _recv_exact(conn, 2)
    _recv_exact(conn, ulen)
    password = _recv_exact(conn, _recv_exact(conn, 1)[0]).decode(errors="replace")
    if not password_ok(password):
        conn.sendall(b"\x01\x01")
        conn.close()
        return None
    conn.sendall(b"\x01\x00")
    _, cmd, _, atyp = _recv_exact(conn, 4)
    if atyp == 1:
        host = str(ipaddress.IPv4Address(_recv_exact(conn, 4)))
    elif atyp == 4:
        host = str(ipaddress.IPv6Address(_recv_exact(conn, 16)))
    elif atyp == 3:
        host = _recv_exact(conn, _recv_exact(conn, 1)[0]).decode()
    else:
        socks5_refuse(conn, 8)
        return None
    port = struct.unpack("!H", _recv_exact(conn, 2))[0]
    if cmd != 1:
        socks5_refuse(conn, 7)
        return None
    conn.settimeout(None)
    return host, port


def socks5_granted(conn: socket.socket) -> None:
    conn.sendall(b"\x05\x00\x00\x01" + b"\x00" * 6)


def socks5_refuse(conn: socket.socket, code: int) -> None:
    try:
        conn.sendall(bytes([5, code, 0, 1]) + b"\x00" * 6)
    finally:
        conn.close()
