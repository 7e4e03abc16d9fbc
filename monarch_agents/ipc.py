"""Same-host links: messages over Unix sockets, large buffers as shared-memory descriptors.

Between two processes of one host, ZeroMQ costs more than the work: each
message crosses two ZeroMQ I/O threads and is CURVE-encrypted, about 150 us
per round trip on a 2-core machine against about 10 us for a Unix socket.  So
a :class:`~monarch_agents.transport.Mailbox` also listens on a Unix socket, and a peer
on the same host is reached through it: the sending thread writes the message
itself, and the receiving IO thread reads it, with no thread in between.
Buffers of :data:`monarch_agents.wire.SHM_THRESHOLD` bytes or more travel as
shared-memory segments (``monarch_agents/shm.py``) whose descriptors ride along
(``SCM_RIGHTS``).  Peers on other hosts still go through ZeroMQ and CURVE.

The socket is named after the process's TCP address, in the abstract
namespace (``\\0monarch-ipc:tcp://127.0.0.1:5555``): no file to clean up, gone
when the process is, and scoped like the loopback address it stands for.

Security, the same rule as CURVE's: only a member of the job is heard, and a
message goes only to a member of the job.

* The kernel tells each end the other's user id (``SO_PEERCRED``); a
  connection from, or to, another user is closed at once.  (Another user
  could otherwise name a socket first.)
* The connecting side opens with a hello: a fresh nonce and an HMAC-SHA256
  over the server public key it expects, the listener's name and the nonce,
  keyed with the secret every member holds (``JobKeys.member_secret``) or,
  towards a host agent, with its own identity's secret: the client's or a
  proc's, which tells the host agent who is asking (``monarch_agents.keys``).
  The listener checks it before it reads anything else; a wrong key gets the
  connection closed, so nothing from an outsider is ever unpickled.
* The listener answers with a welcome: an HMAC keyed with the members' server
  secret over the client public key and the nonce (a host agent: keyed with the
  secret the hello proved).  Until the connecting side has checked it, its
  messages wait in memory: none goes to a process that could not prove it
  belongs to the job.

Messages are not encrypted: a Unix socket never leaves the kernel, and only
root (who can read the keys file anyway) can look into another user's.

Framing: each message is ``(frame count, descriptor count)`` as two u16, one
u64 length per frame, then the frames; its descriptors are attached to its
first bytes.  A stream that breaks this is closed, since nothing after it can
be trusted to start where a message starts.

What this module does not do: talk to other hosts, or reconnect.
"""

from __future__ import annotations

import array
import collections
import fcntl
import os
import socket
import struct
import termios
import threading
from typing import TYPE_CHECKING, Any

from monarch_agents import wire
from monarch_agents.keys import CLIENT, HOST, LOCAL_PROC, MEMBER, PROC

if TYPE_CHECKING:
    from monarch_agents.transport import JobKeys

_NAME_PREFIX = "\0monarch-ipc:"
_HELLO = struct.Struct("!4s16s32s32s")  # magic, nonce, mac, client mac
_WELCOME = struct.Struct("!4s32s")  # magic, mac
_HELLO_MAGIC = b"MNRH"
_WELCOME_MAGIC = b"MNRW"
_PREFIX = struct.Struct("!HH")  # frames, descriptors
_LEN = struct.Struct("!Q")
#: At most this many descriptors ride on one message (the rest of its buffers go in the stream).
MAX_FDS = 32
_RECV = 1 << 18
_ANC = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
#: At most this many queued messages (and about this many bytes) go in one write.
_IOV_MAX = 512
_FLUSH_BYTES = 1 << 20
#: A message of two frames (header, body) shorter than this is joined into one buffer to send.
_JOIN_MAX = 1 << 16
_CONNECT_TIMEOUT_S = 5.0


class LinkError(Exception):
    """The other end broke the protocol (or failed authentication); the link is closed."""


class PeerGone(Exception):
    """The link is closed: its peer went away, or we closed it."""


def socket_name(addr: str) -> str:
    return _NAME_PREFIX + addr


def _hmac(key: str, msg: bytes) -> bytes:
    import hashlib  # here: hashlib costs ~10 ms to import, and CLI commands that only read state need none
    import hmac

    return hmac.new(key.encode(), msg, hashlib.sha256).digest()


def _same_digest(a: bytes, b: bytes) -> bool:
    import hmac

    return hmac.compare_digest(a, b)


def _hello_key(keys: JobKeys, to_host: bool) -> str:
    """What the connecting side keys its hello with: towards a host agent, its own identity (the
    client's secret or a proc's); towards any other member, the secret every member holds."""
    return keys.identity[1] if to_host else keys.member_secret


def _hello_mac(keys: JobKeys, name: str, nonce: bytes, to_host: bool = False, key: str | None = None) -> bytes:
    server = keys.host_server[0] if to_host else keys.server_public
    msg = b"monarch-ipc-hello\0" + server.encode() + b"\0" + name.encode() + b"\0" + nonce
    return _hmac(key if key is not None else _hello_key(keys, to_host), msg)


def _client_mac(keys: JobKeys, name: str, nonce: bytes, key: str | None = None) -> bytes:
    """A second proof in every hello: made with the client's secret by a process that holds it (the
    client, a host agent), zeros otherwise.  A member listener that holds that secret (a client) tells
    its agents from procs by it, as ZAP tells them apart by key over TCP."""
    # A pod's host agent holds the host pair instead of the client's secret (keys.for_hosts).
    key = (keys.client_secret or keys.host_secret) if key is None else key
    return _hmac(key, b"monarch-ipc-client\0" + name.encode() + b"\0" + nonce) if key else bytes(32)


def _hello_bytes(keys: JobKeys, name: str, nonce: bytes, to_host: bool = False) -> bytes:
    return _HELLO.pack(_HELLO_MAGIC, nonce, _hello_mac(keys, name, nonce, to_host), _client_mac(keys, name, nonce))


def _welcome_mac(keys: JobKeys, nonce: bytes, to_host: bool = False, key: str | None = None) -> bytes:
    """A member listener proves the members' server secret; a host agent, the secret the hello used
    (a proc cannot check a proof made with a secret it does not hold)."""
    if to_host:
        return _hmac(key if key is not None else _hello_key(keys, True), b"monarch-ipc-welcome-host\0" + nonce)
    msg = b"monarch-ipc-welcome\0" + keys.client_public.encode() + b"\0" + nonce
    return _hmac(keys.server_secret, msg)


def _hello_roles(keys: JobKeys, to_host: bool) -> list[tuple[str, str]]:
    """(secret, role) a listener accepts hellos keyed with: a host agent tells the client from procs."""
    if not to_host:
        return [(keys.member_secret, MEMBER)]
    return [(k, role) for k, role in ((keys.client_secret, CLIENT), (keys.proc_secret, LOCAL_PROC)) if k]


def _same_user(sock: socket.socket) -> bool:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


def _nbytes(f: Any) -> int:
    return f.nbytes if type(f) is memoryview else len(f)


_heads: dict[int, struct.Struct] = {}


def _head(nframes: int) -> struct.Struct:
    """The struct of a message's prefix and frame lengths (one compiled per frame count)."""
    h = _heads.get(nframes)
    if h is None:
        h = _heads[nframes] = struct.Struct(f"!HH{nframes}Q")
    return h


_local = threading.local()


def _scratch() -> memoryview:
    """This thread's receive buffer (only IO threads receive, one per mailbox)."""
    buf = getattr(_local, "scratch", None)
    if buf is None:
        buf = _local.scratch = memoryview(bytearray(_RECV))
    return buf


_HEAD2 = _head(2)


def _close_fds(fds: Any) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Link:
    """One connection to (``outbound``) or from a process of this host.

    Any thread may :meth:`send`; only the owner's IO thread calls
    :meth:`receive`, :meth:`flush` and :meth:`close`.
    """

    #: Buffers go as shared-memory segments (turned off in tests that want frames).
    same_host = True

    def __init__(self, sock: socket.socket, keys: JobKeys, *, outbound: bool, addr: str = "", name: str = "",
                 nonce: bytes = b"", to_host: bool = False):
        self.sock = sock
        self.fd = sock.fileno()
        self.keys = keys
        self.outbound = outbound
        self.addr = addr  # the peer's address (outbound links only)
        self.name = name  # the listener's socket name (inbound links only)
        self.nonce = nonce
        self.to_host = to_host  # the listener is a host agent's
        #: Who the peer proved to be (inbound links, once the hello is checked): a role of monarch_agents.keys.
        self.role = ""
        #: The longest message read from this link (lowered for procs' keys once the hello says who it is).
        self.max_bytes = wire.MAX_FRAME_BYTES
        self.lock = threading.Lock()
        # Outbound: messages wait until the welcome is checked.  Inbound: nothing is read
        # but the hello until it is checked.
        self.ready = False
        self.pending: collections.deque[list] = collections.deque()  # [data memoryview, fds]
        self.closed = False
        #: Bytes handed to the kernel so far (outbound); with the kernel's count of what the reader
        #: has not taken yet, :meth:`stalled_for` tells whether it reads at all (IO thread).
        self.written = 0
        self._seen = (0, 0)  # (written, unread) at the last look
        self._stall_start: float | None = None
        self._rbuf = bytearray()
        self._rfds: collections.deque[int] = collections.deque()

    @property
    def connected(self) -> bool:
        return self.ready

    # -- sending (any thread) ------------------------------------------------------

    def send(self, frames: list[Any], fds: list[int]) -> bool:
        """Write one message, or queue what could not be written.

        Takes over ``fds``.  Returns True when the IO thread must wait for the
        socket to drain; raises :class:`PeerGone` if the link is closed.
        """
        if not fds and len(frames) == 2:
            a, b = frames
            if type(a) is bytes and type(b) is bytes:
                nb = len(b)
                if nb < _JOIN_MAX:
                    return self._send_small(_HEAD2.pack(2, 0, len(a), nb) + a + b)
        lens = [_nbytes(f) for f in frames]
        head = _head(len(frames)).pack(len(frames), len(fds), *lens)
        parts = [head, *frames]
        total = len(head) + sum(lens)
        with self.lock:
            if self.closed:
                _close_fds(fds)
                raise PeerGone(self.addr)
            if self.pending or not self.ready:
                # Copied: the caller may reuse its buffers once we return.  Only the first message
                # queued asks for the IO thread: it watches the socket until the queue is empty
                # (a waking call per message was ~10% of a busy sender's time).
                first = not self.pending
                self.pending.append([memoryview(b"".join(parts)), fds])
                return self.ready and first
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            try:
                sent = self.sock.sendmsg(parts, anc, _SEND_FLAGS)
            except BlockingIOError:
                sent = -1
            except OSError:
                _close_fds(fds)
                raise PeerGone(self.addr) from None
            if sent >= 0:
                self.written += sent
                _close_fds(fds)  # the peer has its own copies now
                fds = []
                if sent == total:
                    return False
            rest = b"".join(parts)[max(sent, 0):]
            self.pending.append([memoryview(rest), fds])
            return True

    def _send_small(self, data: bytes) -> bool:
        """:meth:`send` of a small message without descriptors, already joined (most messages:
        one ``send`` of one buffer costs less than building a list of parts for ``sendmsg``)."""
        with self.lock:
            if self.closed:
                raise PeerGone(self.addr)
            if self.pending or not self.ready:
                first = not self.pending
                self.pending.append([memoryview(data), []])
                return self.ready and first
            try:
                sent = self.sock.send(data, _SEND_FLAGS)
            except BlockingIOError:
                sent = 0
            except OSError:
                raise PeerGone(self.addr) from None
            self.written += sent
            if sent == len(data):
                return False
            self.pending.append([memoryview(data)[sent:], []])
            return True

    def flush(self) -> bool:
        """Write what is queued (IO thread); True while some is left."""
        with self.lock:
            pending = self.pending
            while pending and self.ready and not self.closed:
                entry = pending[0]
                data, fds = entry
                if fds:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    parts = [data]
                else:
                    # Every queued message up to the next one with descriptors, in one write: a
                    # burst of small messages costs one system call, not one each.
                    anc, parts, total = [], [], 0
                    for e in pending:
                        if e[1] or len(parts) >= _IOV_MAX or total >= _FLUSH_BYTES:
                            break
                        parts.append(e[0])
                        total += e[0].nbytes
                try:
                    sent = self.sock.sendmsg(parts, anc, _SEND_FLAGS)
                except BlockingIOError:
                    return True
                except OSError:
                    raise PeerGone(self.addr) from None
                self.written += sent
                if fds:
                    _close_fds(fds)
                    entry[1] = []
                for part in parts:
                    n = part.nbytes
                    if sent < n:
                        pending[0][0] = part[sent:]
                        return True
                    sent -= n
                    pending.popleft()
            return bool(pending) and not self.closed

    def stalled_for(self, now: float) -> float:
        """How long what we wrote has waited with the reader taking none of it (0: it takes some,
        or nothing waits).  IO thread only, called periodically (``message_delivery_timeout``)."""
        buf = array.array("i", [0])
        try:
            # Linux: for a Unix stream socket, the bytes (with their overhead) the reader has not taken.
            fcntl.ioctl(self.fd, termios.TIOCOUTQ, buf, True)
        except OSError:
            return 0.0
        unread = buf[0]
        with self.lock:
            written, waiting = self.written, bool(self.pending) and self.ready
        seen_written, seen_unread = self._seen
        self._seen = (written, unread)
        # Had the reader taken nothing, what is unread would have grown by at least what we wrote since.
        took = unread == 0 or unread < seen_unread + (written - seen_written)
        if unread == 0 and not waiting:
            self._stall_start = None
            return 0.0
        if took or self._stall_start is None:
            self._stall_start = now
            return 0.0
        return now - self._stall_start

    # -- receiving (IO thread) -----------------------------------------------------

    def receive(self) -> tuple[list[tuple[list, list]], bool]:
        """The complete messages that arrived, as ``(frames, fds)``, and whether the peer hung up.

        Raises :class:`LinkError` when the peer broke the protocol.
        """
        eof = False
        scratch = _scratch()
        while True:
            try:
                # Into a buffer kept for the thread: recvmsg(256 KiB) allocates (and the kernel
                # clears) 256 KiB for every read, ~13 us of a ~200-byte call's answer.
                n, anc, flags, _ = self.sock.recvmsg_into((scratch,), _ANC, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(cdata[: len(cdata) - len(cdata) % a.itemsize])
                    self._rfds.extend(a)
            if flags & socket.MSG_CTRUNC:
                raise LinkError("more descriptors than a message may carry")
            if not n:
                eof = True
                break
            self._rbuf += scratch[:n]
            if n < _RECV:
                break
        if not self.ready and not self._handshake():
            return [], eof
        return self._parse(), eof

    def _handshake(self) -> bool:
        buf = self._rbuf
        if self.outbound:
            if len(buf) < _WELCOME.size:
                return False
            magic, mac = _WELCOME.unpack_from(buf)
            if magic != _WELCOME_MAGIC or not _same_digest(mac, _welcome_mac(self.keys, self.nonce, self.to_host)):
                raise LinkError("the listener did not prove it belongs to this job")
            del buf[: _WELCOME.size]
        else:
            if len(buf) < _HELLO.size:
                return False
            magic, nonce, mac, client_mac = _HELLO.unpack_from(buf)
            key = None
            if magic == _HELLO_MAGIC:
                for secret, role in _hello_roles(self.keys, self.to_host):
                    if _same_digest(mac, _hello_mac(self.keys, self.name, nonce, self.to_host, secret)):
                        key, self.role = secret, role
                        break
            if key is None:
                raise LinkError("a peer without the job's keys tried to connect")
            if self.role == MEMBER and self.keys.client_secret:
                # A client's listener: its host agents prove the client's secret, procs cannot.
                if _same_digest(client_mac, _client_mac(self.keys, self.name, nonce, self.keys.client_secret)):
                    self.role = CLIENT
                elif self.keys.host_secret and _same_digest(client_mac, _client_mac(self.keys, self.name, nonce,
                                                                                    self.keys.host_secret)):
                    self.role = HOST  # a pod's host agent (or what else reads its Secret): not the client
                else:
                    self.role = PROC
            del buf[: _HELLO.size]
            welcome = _welcome_mac(self.keys, nonce, self.to_host, key)
            try:  # fits: it is the first thing written on a fresh socket
                self.sock.send(_WELCOME.pack(_WELCOME_MAGIC, welcome), socket.MSG_NOSIGNAL)
            except OSError:
                raise PeerGone(self.addr) from None
        if self.to_host and self.role in (PROC, LOCAL_PROC):
            # A host agent's link from a proc's key: the procs' limit (monarch_agents.wire).
            self.max_bytes = wire.PROC_MAX_FRAME_BYTES
        with self.lock:
            self.ready = True
        return True

    def _parse(self) -> list[tuple[list, list]]:
        buf, out, pos = self._rbuf, [], 0
        view = memoryview(buf)
        try:
            while len(buf) - pos >= _PREFIX.size:
                if self.outbound:
                    raise LinkError("a listener sent a message on a link it should only read")
                nframes, nfds = _PREFIX.unpack_from(buf, pos)
                if nframes == 2 and not nfds:  # most messages: a header and a body
                    start = pos + _HEAD2.size
                    if len(buf) < start:
                        break
                    _, _, la, lb = _HEAD2.unpack_from(buf, pos)
                    if la + lb > self.max_bytes:
                        raise LinkError(f"a {la + lb}-byte message is over the {self.max_bytes}-byte limit "
                                        f"for a {self.role or 'peer'}")
                    end = start + la + lb
                    if len(buf) < end:
                        break
                    out.append(([bytes(view[start:start + la]), bytes(view[start + la:end])], ()))
                    pos = end
                    continue
                if nframes == 0 or nfds > MAX_FDS:
                    raise LinkError("malformed message framing")
                head = _head(nframes)
                start = pos + head.size
                if len(buf) < start:
                    break
                lens = head.unpack_from(buf, pos)[2:]
                if sum(lens) > self.max_bytes:
                    # Refused on its header, before any of it is buffered.
                    raise LinkError(f"a {sum(lens)}-byte message is over the {self.max_bytes}-byte limit for a {self.role or 'peer'}")
                end = start + sum(lens)
                if len(buf) < end:
                    break
                if len(self._rfds) < nfds:
                    raise LinkError("a message's descriptors did not arrive with it")
                frames = []
                for n in lens:
                    frames.append(bytes(view[start : start + n]))
                    start += n
                out.append((frames, [self._rfds.popleft() for _ in range(nfds)]))
                pos = end
        finally:
            view.release()
        if pos:
            del buf[:pos]
        return out

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            pending, self.pending = self.pending, collections.deque()
        for _, fds in pending:
            _close_fds(fds)
        _close_fds(self._rfds)
        self._rfds.clear()
        self.sock.close()


def connect(addr: str, keys: JobKeys, to_host: bool = False) -> Link | None:
    """An outbound link to the process at ``addr`` on this host (a host agent's with ``to_host``);
    None if it has no Unix socket (or it belongs to another user), so the caller can use TCP instead."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(_CONNECT_TIMEOUT_S)  # only waits when the listener's backlog is full
        s.connect(socket_name(addr))
        if not _same_user(s):
            s.close()
            return None
        nonce = os.urandom(16)
        s.sendall(_hello_bytes(keys, socket_name(addr), nonce, to_host))
        s.setblocking(False)
    except OSError:
        s.close()
        return None
    return Link(s, keys, outbound=True, addr=addr, nonce=nonce, to_host=to_host)


class Listener:
    """The Unix socket a mailbox is reached at from its own host."""

    def __init__(self, addr: str, keys: JobKeys, host: bool = False):
        self.name = socket_name(addr)
        self.keys = keys
        self.host = host  # a host agent's: hellos tell the client from procs
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            s.bind(self.name)
            s.listen(1024)
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        self.sock = s
        self.fd = s.fileno()

    def accept(self) -> tuple[list[Link], int]:
        """New inbound links, and how many connections from other users were refused."""
        links, refused = [], 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not _same_user(conn):
                conn.close()
                refused += 1
                continue
            conn.setblocking(False)
            links.append(Link(conn, self.keys, outbound=False, name=self.name, to_host=self.host))
        return links, refused

    def close(self) -> None:
        self.sock.close()
