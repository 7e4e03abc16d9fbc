"""The FAKE API server's ``pods/{name}/portforward``: a WebSocket, as the real one serves it.

What the official ``kubernetes`` client (``kubernetes.stream.portforward``) speaks: an HTTP
``GET .../pods/NAME/portforward?ports=P`` upgraded to a WebSocket (RFC 6455) with the
``v4.channel.k8s.io`` subprotocol.  Each port has two channels, data (``2*i``) and error
(``2*i+1``); each channel's first frame is its channel byte and the port, little-endian; after
that every binary frame is a channel byte and payload.  A port nobody listens on is answered
on the error channel, as the kubelet does, and the stream ends.

One connection to the pod per stream, as on a real cluster: the API server dials the pod's IP
from its own network stack, which is what lets a client that cannot route to pod IPs reach
them.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import struct
import threading
from typing import BinaryIO

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PROTOCOL = "v4.channel.k8s.io"
_BINARY, _CLOSE, _PING, _PONG = 0x2, 0x8, 0x9, 0xA


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def read_frame(rfile: BinaryIO) -> tuple[int, bytes] | None:
    """One (opcode, payload) from a client (whose frames are masked); None at end of stream."""
    head = rfile.read(2)
    if len(head) < 2:
        return None
    opcode, n = head[0] & 0x0F, head[1] & 0x7F
    masked = head[1] & 0x80
    if n == 126:
        n = struct.unpack("!H", rfile.read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", rfile.read(8))[0]
    mask = rfile.read(4) if masked else b""
    data = rfile.read(n)
    if len(data) < n:
        return None
    if masked:
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data)) if n < 64 else _unmask(data, mask)
    return opcode, data


def _unmask(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")


def frame(opcode: int, payload: bytes) -> bytes:
    """A server's frame (unmasked, final)."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


def serve(handler, pod_ip: str, port: int, pod_name: str) -> None:
    """Upgrade ``handler``'s request and carry bytes between it and ``pod_ip:port`` until either ends."""
    handler.send_response(101, "Switching Protocols")
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept_key(handler.headers.get("Sec-WebSocket-Key", "")))
    handler.send_header("Sec-WebSocket-Protocol", PROTOCOL)
    handler.end_headers()
    handler.close_connection = True
    lock = threading.Lock()

    def send(opcode: int, payload: bytes) -> None:
        with lock:
            handler.wfile.write(frame(opcode, payload))
            handler.wfile.flush()

    tag = struct.pack("<H", port)
    send(_BINARY, b"\x00" + tag)
    send(_BINARY, b"\x01" + tag)
    try:
        pod = socket.create_connection((pod_ip, port), timeout=5)
    except OSError as e:
        send(_BINARY, b"\x01" + f"error forwarding port {port} to pod {pod_name}: {e}".encode())
        send(_CLOSE, b"")
        return
    pod.settimeout(None)

    def pod_to_client() -> None:
        try:
            while True:
                data = pod.recv(1 << 16)
                if not data:
                    break
                send(_BINARY, b"\x00" + data)
        except OSError:
            pass
        try:
            send(_CLOSE, b"")
        except OSError:
            pass

    t = threading.Thread(target=pod_to_client, name="fake-portforward", daemon=True)
    t.start()
    try:
        while True:
            f = read_frame(handler.rfile)
            if f is None or f[0] == _CLOSE:
                break
            opcode, data = f
            if opcode == _PING:
                send(_PONG, data)
            elif opcode == _BINARY and data[:1] == b"\x00" and len(data) > 1:
                pod.sendall(data[1:])
    except OSError:
        pass
    finally:
        try:
            pod.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        t.join(timeout=5)
        pod.close()
