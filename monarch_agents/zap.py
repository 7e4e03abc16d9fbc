"""The ZAP handler that decides which CURVE clients a mailbox admits.

ZeroMQ asks the ZAP handler of a context (RFC 27: a REP-style exchange on
``inproc://zeromq.zap.01``) about every CURVE handshake; we admit exactly the
job's client key and its procs' key, and tell the mailbox which one a peer used
(the ZAP user id, which ZeroMQ then attaches to every frame from that peer).  pyzmq ships ``zmq.auth.thread.ThreadAuthenticator`` for
this, but it imports asyncio (~25 ms of every ``monarch run``) and does far
more than one key check, so this is the small version.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq
import zmq.utils.z85

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_VERSION = b"1.0"

log = logging.getLogger("monarch.auth")


class KeyGate:
    """Admits CURVE clients whose public key is in ``allowed`` (z85 -> role); refuses the rest.

    A peer's frames then carry its role as their ``User-Id`` property.
    """

    def __init__(self, ctx: zmq.Context, allowed: dict[bytes, str] | set[bytes]):
        self.ctx = ctx
        if not isinstance(allowed, dict):
            allowed = {k: "client" for k in allowed}
        # Keys arrive raw (32 bytes) in ZAP requests; compare in that form.
        self.allowed = {(zmq.utils.z85.decode(k) if len(k) == 40 else k): role.encode() for k, role in allowed.items()}
        self._sock = ctx.socket(zmq.REP)
        self._sock.linger = 0
        self._sock.bind(ZAP_ENDPOINT)  # one per context: a second bind fails loudly (EADDRINUSE)
        self._stop_addr = f"inproc://zap-stop-{id(self)}"
        self._stop_recv = ctx.socket(zmq.PAIR)
        self._stop_recv.bind(self._stop_addr)
        self._thread = threading.Thread(target=self._loop, name="zap", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._stop_recv, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._stop_recv in ready:
                    return
                if self._sock in ready:
                    self._answer(self._sock.recv_multipart())
        except zmq.ContextTerminated:
            pass
        finally:
            self._sock.close(0)
            self._stop_recv.close(0)

    def _answer(self, frames: list[bytes]) -> None:
        # version, request id, domain, address, identity, mechanism, credentials...
        if len(frames) < 6 or frames[0] != _VERSION:
            request_id = frames[1] if len(frames) > 1 else b""
            self._sock.send_multipart([_VERSION, request_id, b"400", b"malformed ZAP request", b"", b""])
            return
        request_id, address, mechanism, creds = frames[1], frames[3], frames[5], frames[6:]
        role = self.allowed.get(creds[0]) if mechanism == b"CURVE" and creds else None
        if role is not None:
            self._sock.send_multipart([_VERSION, request_id, b"200", b"OK", role, b""])
        else:
            log.info("refused a %s peer from %s", mechanism.decode(errors="replace"), address.decode(errors="replace"))
            self._sock.send_multipart([_VERSION, request_id, b"400", b"not this job's key", b"", b""])

    def stop(self, deadline: float | None = None) -> None:
        """Stop answering, waiting for its thread until ``deadline`` (``time.monotonic()``; default
        2 s from now); call it after closing the sockets it guards. Safe to call twice."""
        if not self._thread.is_alive():
            return
        s = self.ctx.socket(zmq.PAIR)
        s.linger = 0
        try:
            s.connect(self._stop_addr)
            s.send(b"")
        finally:
            s.close()
        self._thread.join(timeout=2.0 if deadline is None else max(0.0, deadline - time.monotonic()))
