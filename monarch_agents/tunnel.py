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
import threading

from monarch_agents.keys import JobKeys

#: The longest request line either side reads (a request is a few dozen bytes).
MAX_LINE = 4096


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
