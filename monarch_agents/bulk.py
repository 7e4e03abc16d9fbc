"""Big buffers between hosts: beside the CURVE connection, not through it.

libzmq's CURVE seals a whole message in its one I/O thread, with a copy on each side, and
moved 64 MiB messages at about a tenth of what one core of libsodium encrypts and a veth
pair carries (``benchmarks/link_bench.py``).  And while one huge message is on a ZeroMQ
connection nothing else is: not the heartbeat's answer, so a 5 s heartbeat declares the
peer dead once a transfer outlasts it.

So a message whose out-of-band buffers are big goes in two parts:

1. on the authenticated CURVE connection, a small message: a descriptor (a fresh random
   transfer id and a fresh random 256-bit key, the port to fetch from, the big frames'
   lengths) followed by the message's own frames with the big ones left empty;
2. the receiver connects to the sender's *bulk port* (the address the CURVE connection came
   from, the port the descriptor names), says the transfer id and which stream it is, and
   reads the big frames as AEAD-sealed 1 MiB chunks (libsodium's AES-256-GCM where the CPU
   has it, else ChaCha20-Poly1305), decrypting each in place into the bytes it delivers.

Confidentiality and integrity are the CURVE channel's: the key never leaves it, every chunk
is authenticated with its index as the nonce (no reordering, no splicing from another
transfer, whose key differs), and the receiver knows from the descriptor exactly which
chunks make the message (no truncation).  Knowing a transfer id lets one read ciphertext
only.  The receiver delivers nothing it has not verified whole, and holds the messages that
came after the descriptor on the same connection until then (order is kept).

Speed: the chunks go over ``STREAMS`` TCP connections, each sealed and sent (or received
and opened) by its own thread; libsodium and socket calls release the GIL, so the cipher
runs beside the kernel's copies on another core, and the only Python work is a few calls
per MiB.  The sender's buffers are read where they are (no copy before sealing); the
receiver's chunks land where the delivered ``bytes`` will live.

Failures: a receiver that cannot connect (a firewall, a cipher its CPU lacks) or a stream
cut short makes the sender send the whole message on the CURVE connection instead, marked
with the same transfer id so that a receiver who did get it all drops the copy.  A peer
declared dead ends its transfers at once (:class:`~monarch_agents.transport.PeerLost`), and
a stream that makes no progress for ``STALL_S`` fails.
"""

from __future__ import annotations

import glob
import logging
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("monarch.bulk")

#: Parallel TCP streams per transfer (``MONARCH_BULK_STREAMS``; 0 turns the bulk path off).
STREAMS = int(os.environ.get("MONARCH_BULK_STREAMS", "2"))
#: A message goes by bulk when its big frames hold at least this many bytes together.
MIN_BYTES = 4 << 20
#: A frame at least this large is a big one.
MIN_FRAME = 1 << 20
#: Sealed unit (``MONARCH_BULK_CHUNK``): big enough that the Python calls per chunk cost nothing beside
#: it; the descriptor says it, so the two ends need not agree beforehand.
CHUNK = int(os.environ.get("MONARCH_BULK_CHUNK", 1 << 20))
_CHUNK_RANGE = (4 << 10, 64 << 20)
TAG = 16
#: A stream that moves no byte for this long has failed (a host that vanished sends no reset).
STALL_S = 30.0
#: How long the sender waits for the receiver's first stream before sending on CURVE instead.
CONNECT_S = 10.0
#: How long a connection to the bulk port has to say which transfer it wants.
HELLO_S = 3.0
#: Connections that have not said so yet, at most (the oldest is closed beyond).
MAX_PENDING = 128

MAGIC = b"MNRB"
_VERSION = 1
_FLAG_INLINE = 1  # the big frames are in this message after all (the bulk fetch failed)
CIPHER_AES256GCM = 1
CIPHER_CHACHA20POLY1305 = 2
# magic, version, flags, cipher, streams, port, chunk size, transfer id, key, number of big frames
_DESC = struct.Struct("!4sBBBBHI16s32sH")
_BIG = struct.Struct("!HQ")  # frame index (in the message's frames), length
_HELLO = struct.Struct("!16sB")  # transfer id, stream index
_ACK = b"\x01"


class BulkError(Exception):
    """A descriptor that does not parse, or a transfer that failed."""


# -- libsodium ------------------------------------------------------------------------------------


class _Sodium:
    """libsodium's AEADs through ctypes (which releases the GIL for each call).

    ctypes is imported here, on first use, not with the transport: every process starts with
    the transport, few send big buffers to another host.
    """

    def __init__(self, path: str):
        import ctypes

        class PyBuffer(ctypes.Structure):  # CPython's Py_buffer
            _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]

        self.ctypes, self.PyBuffer = ctypes, PyBuffer
        lib = ctypes.CDLL(path)
        if lib.sodium_init() < 0:
            raise OSError("sodium_init failed")
        self.lib = lib
        vp, ull, cp = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_char_p
        self.ciphers: dict[int, tuple[Any, Any]] = {}
        for cid, name in ((CIPHER_AES256GCM, "aes256gcm"), (CIPHER_CHACHA20POLY1305, "chacha20poly1305_ietf")):
            if cid == CIPHER_AES256GCM and not lib.crypto_aead_aes256gcm_is_available():
                continue  # libsodium has AES-GCM only in hardware
            enc = getattr(lib, f"crypto_aead_{name}_encrypt_detached")
            enc.argtypes = (vp, vp, vp, vp, ull, vp, ull, vp, cp, cp)
            dec = getattr(lib, f"crypto_aead_{name}_decrypt_detached")
            dec.argtypes = (vp, vp, vp, ull, vp, vp, ull, cp, cp)
            self.ciphers[cid] = (enc, dec)
        #: What this host seals with: the fastest it has.
        self.preferred = min(self.ciphers)
        get = ctypes.pythonapi.PyObject_GetBuffer
        get.argtypes = (ctypes.py_object, ctypes.POINTER(PyBuffer), ctypes.c_int)
        rel = ctypes.pythonapi.PyBuffer_Release
        rel.argtypes = (ctypes.POINTER(PyBuffer),)
        self._get, self._release = get, rel

    def address(self, writable: Any) -> int:
        """Where a writable buffer (a bytearray) begins."""
        return self.ctypes.addressof(self.ctypes.c_char.from_buffer(writable))


_sodium: _Sodium | None = None
_sodium_tried = False
_sodium_lock = threading.Lock()


def sodium() -> _Sodium | None:
    """libsodium, the copy pyzmq ships (CURVE's own) or the system's; None where there is none."""
    global _sodium, _sodium_tried
    with _sodium_lock:
        if not _sodium_tried:
            _sodium_tried = True
            import zmq

            here = os.path.join(os.path.dirname(zmq.__file__), "..", "pyzmq.libs", "libsodium*")
            for path in [*sorted(glob.glob(here)), "libsodium.so.26", "libsodium.so.23"]:
                try:
                    _sodium = _Sodium(path)
                    break
                except (OSError, AttributeError) as e:
                    log.debug("no libsodium at %s: %s", path, e)
        return _sodium


class _Pinned:
    """The address of a contiguous buffer (read-only ones too), held until :meth:`release`."""

    def __init__(self, s: _Sodium, obj: Any):
        self._s = s
        self._view = s.PyBuffer()
        if s._get(obj, s.ctypes.byref(self._view), 0) != 0:  # PyBUF_SIMPLE: contiguous bytes
            raise BufferError("not a contiguous buffer")
        self.addr = self._view.buf or 0
        self.nbytes = self._view.len

    def release(self) -> None:
        if self._view is not None:
            self._s._release(self._s.ctypes.byref(self._view))
            self._view = None


def _nonce(i: int) -> bytes:
    return struct.pack("<Q4x", i)


def _layout(lengths: list[int], chunk: int) -> list[tuple[int, int, int]]:
    """The chunks of the big frames: (which big frame, offset, length), in nonce order."""
    return [(j, off, min(chunk, n - off)) for j, n in enumerate(lengths) for off in range(0, n, chunk)]


# -- the descriptor --------------------------------------------------------------------------------


@dataclass
class Descriptor:
    tid: bytes
    key: bytes
    cipher: int
    streams: int
    port: int
    big: list[tuple[int, int]]  # (frame index, length)
    inline: bool = False
    chunk: int = CHUNK

    def pack(self) -> bytes:
        head = _DESC.pack(MAGIC, _VERSION, _FLAG_INLINE if self.inline else 0, self.cipher, self.streams,
                          self.port, self.chunk, self.tid, self.key, len(self.big))
        return head + b"".join(_BIG.pack(i, n) for i, n in self.big)


def is_descriptor(frame: Any) -> bool:
    return bytes(memoryview(frame)[:4]) == MAGIC


def parse(frame: Any, nframes: int, max_frame: int) -> Descriptor:
    """The descriptor in ``frame``, checked against the ``nframes`` frames after it.  Raises BulkError."""
    raw = bytes(memoryview(frame))
    try:
        magic, version, flags, cipher, streams, port, chunk, tid, key, nbig = _DESC.unpack_from(raw)
    except struct.error:
        raise BulkError("a short bulk descriptor") from None
    if version != _VERSION:
        raise BulkError(f"bulk descriptor version {version}, expected {_VERSION}")
    if len(raw) != _DESC.size + nbig * _BIG.size:
        raise BulkError("a bulk descriptor of the wrong length")
    big = [_BIG.unpack_from(raw, _DESC.size + k * _BIG.size) for k in range(nbig)]
    seen = set()
    for i, n in big:
        if i < 2 or i >= nframes or i in seen:
            raise BulkError(f"a bulk descriptor names frame {i} of {nframes}")
        if n > max_frame:
            raise BulkError(f"a {n}-byte bulk frame is over the {max_frame}-byte limit")
        seen.add(i)
    if not 1 <= streams <= 64 or not port or not _CHUNK_RANGE[0] <= chunk <= _CHUNK_RANGE[1]:
        raise BulkError("a bulk descriptor with no streams, no port or a chunk size out of range")
    return Descriptor(tid, key, cipher, streams, port, big, bool(flags & _FLAG_INLINE), chunk)


# -- the sender's side -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Transfer:
    desc: Descriptor
    peer: str
    sources: list[_Pinned]
    layout: list[tuple[int, int, int]]
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    socks: dict[int, socket.socket] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    error: str = ""
    threads: list[threading.Thread] = field(default_factory=list)

    def fail(self, why: str) -> None:
        with self.lock:
            if not self.error and len(self.finished) < self.desc.streams:
                self.error = why
            socks = list(self.socks.values())
        for s in socks:
            _shutdown(s)
        self.done.set()


class Outbox:
    """The sender's bulk ports (one per local address peers reach it from) and its transfers.

    Owns one thread, ``<name>-bulk``, that accepts connections and reads their hello; each
    stream of a transfer is then sealed and written by a thread of its own that ends with it.
    """

    def __init__(self, name: str):
        self.name = name
        self._sodium = sodium()
        self._lock = threading.Lock()
        self._transfers: dict[bytes, _Transfer] = {}
        self._listeners: dict[str, socket.socket] = {}
        self._sel = selectors.DefaultSelector()
        self._pending: dict[socket.socket, tuple[float, bytearray]] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._sodium is not None and STREAMS > 0

    def _port(self, local_ip: str) -> int:
        with self._lock:
            if self._closed:
                raise BulkError("closed")
            s = self._listeners.get(local_ip)
            if s is None:
                family = socket.AF_INET6 if ":" in local_ip else socket.AF_INET
                s = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
                try:
                    s.bind((local_ip, 0))
                    s.listen(64)
                except OSError:
                    s.close()
                    raise
                self._listeners[local_ip] = s
                self._sel.register(s, selectors.EVENT_READ, "listen")
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=f"{self.name}-bulk", daemon=True)
                    self._thread.start()
                else:
                    os.write(self._wake_w, b"x")
            return s.getsockname()[1]

    def send(self, peer: str, local_ip: str, frames: list[Any], big: list[int],
             send_small: Callable[[list[Any]], None], alive: Callable[[], bool]) -> tuple[str, Descriptor, bool]:
        """Send ``frames`` to ``peer``, the frames at indexes ``big`` over the bulk streams.

        ``send_small(frames)`` sends on the CURVE connection; ``alive()`` says whether the peer
        is still believed alive.  Returns ("", its descriptor, True) when the receiver got it all,
        else why not (the caller then sends the message whole: :func:`inline_frames`), the
        descriptor, and whether the receiver reached the bulk port at all.  Raises what
        ``send_small`` raises.
        """
        s = self._sodium
        assert s is not None
        port = self._port(local_ip)
        sources: list[_Pinned] = []
        try:
            for i in big:
                sources.append(_Pinned(s, frames[i]))
            lengths = [p.nbytes for p in sources]
            desc = Descriptor(os.urandom(16), os.urandom(32), s.preferred, STREAMS, port, list(zip(big, lengths)))
            t = _Transfer(desc, peer, sources, _layout(lengths, desc.chunk))
            with self._lock:
                self._transfers[desc.tid] = t
            try:
                small = list(frames)
                for i in big:
                    small[i] = b""
                send_small([desc.pack(), *small])
                deadline = time.monotonic() + CONNECT_S
                # Wait for the streams, looking up now and then: a peer declared dead (its
                # streams are shut then too) or one that never connects must not hold us.
                while not t.done.wait(0.5):
                    if not alive():
                        t.fail("the peer was lost")
                    elif not t.socks and time.monotonic() > deadline:
                        t.fail(f"no bulk stream within {CONNECT_S:.0f} s")
            finally:
                with self._lock:
                    self._transfers.pop(desc.tid, None)
                t.fail("ended")  # no-op once finished: shuts whatever stream is left
                with t.lock:
                    threads = list(t.threads)
                for th in threads:  # they read our buffers: not released before they end
                    th.join()
            return t.error, desc, bool(t.socks)
        finally:
            for p in sources:
                p.release()

    def fail_peer(self, peer: str) -> None:
        """``peer`` is dead: end its transfers now."""
        with self._lock:
            ts = [t for t in self._transfers.values() if t.peer == peer]
        for t in ts:
            t.fail("the peer was lost")

    def _loop(self) -> None:
        while not self._closed:
            now = time.monotonic()
            timeout = min((d for d, _ in self._pending.values()), default=now + 60) - now
            for key, _ in self._sel.select(max(0.0, timeout)):
                if key.data is None:
                    try:
                        os.read(self._wake_r, 512)
                    except BlockingIOError:
                        pass
                elif key.data == "listen":
                    self._accept(key.fileobj)
                else:
                    self._hello(key.fileobj)
            now = time.monotonic()
            for c in [c for c, (d, _) in self._pending.items() if d <= now]:
                self._drop(c)

    def _accept(self, listener: Any) -> None:
        while True:
            try:
                c, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors: the pending ones' deadlines free some
                log.warning("%s: bulk accept: %s", self.name, e)
                return
            c.setblocking(False)
            if len(self._pending) >= MAX_PENDING:
                self._drop(min(self._pending, key=lambda k: self._pending[k][0]))
            self._pending[c] = (time.monotonic() + HELLO_S, bytearray())
            self._sel.register(c, selectors.EVENT_READ, "hello")

    def _drop(self, c: socket.socket) -> None:
        self._pending.pop(c, None)
        try:
            self._sel.unregister(c)
        except (KeyError, ValueError):
            pass
        c.close()

    def _hello(self, c: Any) -> None:
        _, got = self._pending[c]
        try:
            data = c.recv(_HELLO.size - len(got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(c)
            return
        got += data
        if len(got) < _HELLO.size:
            return
        self._pending.pop(c)
        self._sel.unregister(c)
        tid, k = _HELLO.unpack(bytes(got))
        with self._lock:
            t = self._transfers.get(tid)
        if t is None or k >= t.desc.streams:
            c.close()
            return
        with t.lock:
            if k in t.socks or t.done.is_set():
                c.close()
                return
            t.socks[k] = c
            c.setblocking(True)
            _stall_timeouts(c)
            th = threading.Thread(target=self._stream, args=(t, k, c), name=f"{self.name}-bulk-out", daemon=True)
            t.threads.append(th)
            th.start()

    def _stream(self, t: _Transfer, k: int, c: socket.socket) -> None:
        s = self._sodium
        assert s is not None
        enc = s.ciphers[t.desc.cipher][0]
        out = bytearray(t.desc.chunk + TAG)
        out_addr = s.address(out)
        view = memoryview(out)
        key, tid, n_streams = t.desc.key, t.desc.tid, t.desc.streams
        try:
            for i in range(k, len(t.layout), n_streams):
                j, off, n = t.layout[i]
                enc(out_addr, out_addr + n, None, t.sources[j].addr + off, n, tid, len(tid), None, _nonce(i), key)
                c.sendall(view[:n + TAG])
            if c.recv(1) != _ACK:
                raise OSError("the receiver closed before it acknowledged")
            with t.lock:
                t.finished.add(k)
                if len(t.finished) == n_streams:
                    t.done.set()
        except OSError as e:
            t.fail(f"bulk stream {k}: {e or type(e).__name__}")
        finally:
            view.release()
            c.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ts = list(self._transfers.values())
            listeners, self._listeners = list(self._listeners.values()), {}
        for t in ts:
            t.fail("the mailbox closed")
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(2.0)
        for s in listeners:
            s.close()
        for c in list(self._pending):
            c.close()
        self._pending.clear()
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def inline_frames(desc: Descriptor, frames: list[Any]) -> list[Any]:
    """The whole message on the CURVE connection, marked with its transfer id (see the module docstring)."""
    d = Descriptor(desc.tid, b"\0" * 32, desc.cipher, desc.streams, desc.port, desc.big, True, desc.chunk)
    return [d.pack(), *frames]


# -- the receiver's side ---------------------------------------------------------------------------


class Inbox:
    """The receiver's fetches in flight, so that closing the mailbox ends them (their sockets are shut)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._closed = False

    def fetch(self, desc: Descriptor, host: str, dsts: list[memoryview]) -> None:
        """Read the big frames of ``desc`` from ``host`` into ``dsts`` (writable, of their lengths), verified.

        Runs the streams on threads of its own (the first on the caller's).  Raises BulkError.
        """
        s = sodium()
        if s is None or desc.cipher not in s.ciphers:
            raise BulkError(f"this host cannot open cipher {desc.cipher}")
        dec = s.ciphers[desc.cipher][1]
        layout = _layout([n for _, n in desc.big], desc.chunk)
        pins = [_Pinned(s, d) for d in dsts]
        errors: list[str] = []

        def stream(k: int) -> None:
            c = None
            try:
                c = socket.create_connection((host, desc.port), timeout=HELLO_S)
                c.settimeout(None)
                _stall_timeouts(c)
                with self._lock:
                    if self._closed:
                        raise BulkError("closing")
                    self._socks.add(c)
                c.sendall(_HELLO.pack(desc.tid, k))
                tag = bytearray(TAG)
                tag_addr = s.address(tag)
                for i in range(k, len(layout), desc.streams):
                    j, off, n = layout[i]
                    _recv_exactly(c, dsts[j][off:off + n])
                    _recv_exactly(c, memoryview(tag))
                    at = pins[j].addr + off
                    if dec(at, None, at, n, tag_addr, desc.tid, len(desc.tid), _nonce(i), desc.key) != 0:
                        raise BulkError(f"chunk {i} failed authentication")
                c.sendall(_ACK)
            except (OSError, BulkError) as e:
                errors.append(f"stream {k}: {e or type(e).__name__}")
            finally:
                if c is not None:
                    with self._lock:
                        self._socks.discard(c)
                    c.close()

        try:
            helpers = [threading.Thread(target=stream, args=(k,), name="bulk-in", daemon=True)
                       for k in range(1, desc.streams)]
            for th in helpers:
                th.start()
            stream(0)
            for th in helpers:
                th.join()
        finally:
            for p in pins:
                p.release()
        if errors:
            raise BulkError("; ".join(errors))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = list(self._socks)
        for c in socks:
            _shutdown(c)


def _recv_exactly(c: socket.socket, view: memoryview) -> None:
    got, n = 0, view.nbytes
    while got < n:
        r = c.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if r == 0:
            raise OSError("the sender closed the stream")
        got += r


def _stall_timeouts(c: socket.socket) -> None:
    """Blocking calls that fail after ``STALL_S`` without progress (MSG_WAITALL then waits in the kernel)."""
    tv = struct.pack("ll", int(STALL_S), 0)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _shutdown(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
