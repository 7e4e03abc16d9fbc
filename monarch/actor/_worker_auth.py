"""The worker secret, and the handshake that proves it, for Monarch's worker bootstrap.

``run_worker_loop_forever`` serves whoever reaches its address, and what a client sends it are the
keys of a job (with them the worker's host agent runs any code it is sent).  On a shared machine a
hostile local user can reach that address too, or listen at it first.  So both ends prove, before
anything secret moves, that they hold the same *worker secret*: 32 random bytes (hex) in a file
only the user may read, ``~/.monarch/worker.key`` (made at first use, 0600; or the file
``MONARCH_WORKER_SECRET_FILE`` names, e.g. a Kubernetes Secret mounted in a pod).  The secret
never crosses the wire; ``ca="trust_all_connections"`` (Monarch's only setting: no certificate
authority) is authenticated this way instead of not at all.

The handshake, one JSON line each way, each side with a fresh 32-byte nonce::

    client -> worker   {"monarch_worker": 1, "nonce": Nc}
    worker -> client   {"monarch_worker": 1, "nonce": Nw, "proof": HMAC(S, "worker" Nc Nw)}
    client -> worker   {"proof": HMAC(S, "client" Nc Nw), "box": seal(K, 0, the job's keys)}
    worker -> client   {"box": seal(K, 1, the host agent's address)}
    ... the connection stays open while the client uses the worker ...
    client -> worker   {"shutdown": seal(K, 2, "shutdown")}     (HostMesh.shutdown)

The client checks the worker's proof before it sends its own proof or anything sealed, so a
program that is not the user's worker (another user's, listening first) learns a nonce and
nothing else; the worker checks the client's proof before it opens the box or starts anything.
``K = HMAC(S, "session" Nc Nw)``; ``seal`` is libsodium's ChaCha20-Poly1305 (the library CURVE
already uses), so the keys are confidential and tamper-evident on the wire.  The proofs carry
different labels, so one side's proof is never the other's.  The shutdown line, which ends the
worker's loop, is sealed too: a program that relays the connection (listening at the address the
client dials) can drop it, which only stops the agent as the client's exit does, but cannot end the
worker by writing a line of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from monarch_agents.files import private_dir

SECRET_FILE_ENV = "MONARCH_WORKER_SECRET_FILE"
PROTOCOL = 1
#: The longest line either side reads during the handshake (a job's keys are about 1 KiB).
MAX_LINE = 64 * 1024
_NONCE = 32
#: The seal counters of one session: the request (client), the answer (worker), the shutdown (client).
_REQUEST, _ANSWER, _SHUTDOWN = 0, 1, 2


class WorkerAuthError(PermissionError):
    """The other end did not prove the worker secret, or the secret file is not safe to use."""


def secret_path() -> str:
    """Where this user's worker secret is: ``$MONARCH_WORKER_SECRET_FILE``, else ``~/.monarch/worker.key``."""
    named = os.environ.get(SECRET_FILE_ENV)
    if named:
        return os.path.abspath(os.path.expanduser(named))
    return os.path.join(os.path.expanduser("~"), ".monarch", "worker.key")


def _make(path: str) -> None:
    """Write a fresh secret at ``path`` unless one is there (two first uses at once agree: the
    file appears whole, by link, or not at all)."""
    folder = private_dir(os.path.dirname(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".worker-key-")  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process of ours made it first: that one is the secret
    finally:
        os.unlink(tmp)


def load_secret(path: str | None = None) -> bytes:
    """The worker secret, read once from its file (made first where it is the default one).

    Raises :class:`WorkerAuthError` naming the file and the fix when it is a link, not a regular
    file, not this user's, readable or writable by anyone else, or too short.
    """
    named = path is not None or bool(os.environ.get(SECRET_FILE_ENV))
    path = path or secret_path()
    for attempt in (0, 1):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            if named or attempt:
                raise WorkerAuthError(f"worker secret {path} does not exist: copy your worker secret there "
                                      f"(0600), or unset {SECRET_FILE_ENV} to use ~/.monarch/worker.key") from None
            try:
                _make(path)
            except OSError as e:  # a read-only home, an unsafe ~/.monarch (UnsafeFolder says which)
                raise WorkerAuthError(f"cannot make your worker secret {path}: {getattr(e, 'message', None) or e}; "
                                      f"or name a file of yours (0600) with {SECRET_FILE_ENV}") from None
        except OSError as e:  # ELOOP: a symbolic link
            raise WorkerAuthError(f"worker secret {path} cannot be opened safely ({e.strerror}): "
                                  "it must be a regular file of yours, not a link") from None
    try:
        st = os.fstat(fd)  # of what was opened: nothing can swap it between the check and the read
        if not stat.S_ISREG(st.st_mode):
            raise WorkerAuthError(f"worker secret {path} is not a regular file")
        if st.st_uid != os.getuid():
            raise WorkerAuthError(f"worker secret {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): "
                                  "use a file of your own")
        if st.st_mode & 0o077:
            raise WorkerAuthError(f"worker secret {path} is open to others (mode {stat.S_IMODE(st.st_mode):o}): "
                                  f"anyone who read it can use your workers; make a new one (`rm {path}`) "
                                  "or `chmod 600` it if no one did")
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < 32:
        raise WorkerAuthError(f"worker secret {path} holds {len(data)} bytes; it needs at least 32 "
                              f"(`rm {path}` and a new one is made)")
    return data


# -- sealing ---------------------------------------------------------------------------------------


def _aead() -> tuple[Any, Any]:
    from monarch_agents.bulk import sodium

    s = sodium()
    if s is None:
        raise WorkerAuthError("no libsodium here (pyzmq's or the system's): the worker handshake cannot seal the "
                              "job's keys")
    import ctypes

    vp, ull = ctypes.c_void_p, ctypes.c_ulonglong
    enc = s.lib.crypto_aead_chacha20poly1305_ietf_encrypt
    enc.argtypes = (ctypes.c_char_p, ctypes.POINTER(ull), ctypes.c_char_p, ull, ctypes.c_char_p, ull, vp,
                    ctypes.c_char_p, ctypes.c_char_p)
    dec = s.lib.crypto_aead_chacha20poly1305_ietf_decrypt
    dec.argtypes = (ctypes.c_char_p, ctypes.POINTER(ull), vp, ctypes.c_char_p, ull, ctypes.c_char_p, ull,
                    ctypes.c_char_p, ctypes.c_char_p)
    return enc, dec


_TAG = 16


def seal(key: bytes, counter: int, plain: bytes, ad: bytes) -> bytes:
    import ctypes

    enc, _ = _aead()
    out = ctypes.create_string_buffer(len(plain) + _TAG)
    n = ctypes.c_ulonglong(0)
    nonce = counter.to_bytes(12, "little")
    if enc(out, ctypes.byref(n), plain, len(plain), ad, len(ad), None, nonce, key) != 0:
        raise WorkerAuthError("sealing failed")
    return out.raw[:n.value]


def unseal(key: bytes, counter: int, box: bytes, ad: bytes) -> bytes:
    import ctypes

    _, dec = _aead()
    if len(box) < _TAG:
        raise WorkerAuthError("a sealed message too short to be one")
    out = ctypes.create_string_buffer(max(len(box) - _TAG, 1))
    n = ctypes.c_ulonglong(0)
    nonce = counter.to_bytes(12, "little")
    if dec(out, ctypes.byref(n), None, box, len(box), ad, len(ad), nonce, key) != 0:
        raise WorkerAuthError("a sealed message did not open with the session key (changed on the way?)")
    return out.raw[:n.value]


# -- the handshake ---------------------------------------------------------------------------------


def _mac(secret: bytes, label: bytes, nc: bytes, nw: bytes) -> bytes:
    return hmac.new(secret, b"monarch-worker-" + label + b"\0" + nc + nw, hashlib.sha256).digest()


@dataclass
class Session:
    """An authenticated enrollment connection: its socket, session key and the client's request."""

    conn: socket.socket
    key: bytes
    ad: bytes
    request: dict

    def answer(self, info: bytes) -> None:
        """Send the host agent's info line (or an error's JSON), sealed."""
        box = seal(self.key, _ANSWER, info, self.ad)
        self.conn.sendall(json.dumps({"box": box.hex()}).encode() + b"\n")

    def shutdown_line(self) -> bytes:
        """The client's line that ends the worker's loop (``HostMesh.shutdown``), sealed."""
        return json.dumps({"shutdown": seal(self.key, _SHUTDOWN, b"shutdown", self.ad).hex()}).encode() + b"\n"

    def is_shutdown(self, line: bytes) -> bool:
        """Whether ``line`` (without its newline) is the client's sealed shutdown, not one written by
        anyone else on the way."""
        msg = _json(line)
        box = _hex(msg.get("shutdown")) if msg is not None else None
        if box is None:
            return False
        try:
            return unseal(self.key, _SHUTDOWN, box, self.ad) == b"shutdown"
        except WorkerAuthError:
            return False


def read_line(conn: socket.socket, deadline: float, what: str) -> bytes:
    """One line (at most :data:`MAX_LINE` bytes) read by ``deadline``, without its newline; ``b""`` at EOF."""
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"{what}: no full line in time")
        conn.settimeout(left)
        chunk = conn.recv(4096, socket.MSG_PEEK)
        if not chunk:
            return bytes(buf)
        end = chunk.find(b"\n")
        take = len(chunk) if end < 0 else end + 1
        buf += conn.recv(take)
        if end >= 0:
            return bytes(buf[:-1])
        if len(buf) > MAX_LINE:
            raise WorkerAuthError(f"{what}: a line longer than {MAX_LINE} bytes")


def _json(line: bytes) -> dict | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _hex(value: Any, size: int | None = None) -> bytes | None:
    if not isinstance(value, str) or len(value) > 2 * MAX_LINE:
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return None
    return raw if size is None or len(raw) == size else None


def accept(conn: socket.socket, secret: bytes, deadline: float) -> Session:
    """The worker's side: the client proves the secret by ``deadline``, or :class:`WorkerAuthError`
    (after a one-line refusal to the peer); nothing the client sent is opened before its proof."""
    hello = _json(read_line(conn, deadline, "hello"))
    nc = _hex(hello.get("nonce"), _NONCE) if hello is not None and hello.get("monarch_worker") == PROTOCOL else None
    if nc is None:
        conn.sendall(json.dumps({"error": f"not a monarch worker client (protocol {PROTOCOL} hello expected)"})
                     .encode() + b"\n")
        raise WorkerAuthError("the peer did not open with a monarch worker hello")
    nw = os.urandom(_NONCE)
    conn.sendall(json.dumps({"monarch_worker": PROTOCOL, "nonce": nw.hex(),
                             "proof": _mac(secret, b"worker", nc, nw).hex()}).encode() + b"\n")
    reply = _json(read_line(conn, deadline, "proof"))
    proof = _hex(reply.get("proof"), 32) if reply is not None else None
    if proof is None or not hmac.compare_digest(proof, _mac(secret, b"client", nc, nw)):
        conn.sendall(json.dumps({"error": "not authenticated: the client did not prove this worker's secret "
                                          "(its worker secret file differs from the worker's)"}).encode() + b"\n")
        raise WorkerAuthError("the client did not prove the worker secret")
    key = _mac(secret, b"session", nc, nw)
    ad = nc + nw
    box = _hex(reply.get("box")) if reply is not None else None
    if box is None:
        raise WorkerAuthError("the client sent no sealed request")
    request = _json(unseal(key, _REQUEST, box, ad))
    if request is None:
        raise WorkerAuthError("the client's sealed request is not a JSON object")
    return Session(conn, key, ad, request)


def connect(conn: socket.socket, secret: bytes, request: dict, deadline: float, address: str,
            path: str) -> tuple[bytes, Session]:
    """The client's side: check the worker's proof, then send ours and the sealed ``request``;
    returns the worker's answer line, opened, and the session (to seal its shutdown line).  Raises ``RuntimeError`` for a peer that is no monarch
    worker, :class:`WorkerAuthError` for one that does not prove the secret (nothing sent to it)."""
    nc = os.urandom(_NONCE)
    conn.sendall(json.dumps({"monarch_worker": PROTOCOL, "nonce": nc.hex()}).encode() + b"\n")
    line = read_line(conn, deadline, address)
    answer = _json(line)
    if answer is None or ("proof" not in answer and "error" not in answer):
        raise RuntimeError(f"{address} did not answer as a monarch worker does (it answered "
                           f"{line[:60]!r}): is a worker loop (run_worker_loop_forever) serving there?")
    if "error" in answer:
        raise RuntimeError(f"worker {address} refused: {answer['error']}")
    nw, proof = _hex(answer.get("nonce"), _NONCE), _hex(answer.get("proof"), 32)
    if nw is None or proof is None or not hmac.compare_digest(proof, _mac(secret, b"worker", nc, nw)):
        raise WorkerAuthError(f"worker {address} did not prove it holds your worker secret ({path}): it is not "
                              "your worker (another user's program may listen there), or its secret file differs "
                              "from yours; nothing was sent to it")
    key, ad = _mac(secret, b"session", nc, nw), nc + nw
    box = seal(key, _REQUEST, json.dumps(request).encode(), ad)
    conn.sendall(json.dumps({"proof": _mac(secret, b"client", nc, nw).hex(), "box": box.hex()}).encode() + b"\n")
    line = read_line(conn, deadline, address)
    answer = _json(line)
    if answer is not None and "error" in answer:
        raise WorkerAuthError(f"worker {address} refused: {answer['error']}")
    sealed = _hex(answer.get("box")) if answer is not None else None
    if sealed is None:
        raise RuntimeError(f"worker {address} closed the connection before answering"
                           if not line else f"worker {address} answered {line[:60]!r}, not a sealed answer")
    return unseal(key, _ANSWER, sealed, ad), Session(conn, key, ad, request)
