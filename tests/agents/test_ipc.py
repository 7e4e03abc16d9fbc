"""Same-host links: who may connect, who is trusted with messages, what a dead peer leaves behind.

The peers here are real mailboxes and raw Unix sockets speaking (or failing to
speak) the handshake of ``monarch_agents/ipc.py``.
"""

from __future__ import annotations

import os
import queue
import socket
import threading

import pytest
import zmq

from monarch_agents import ipc, shm, transport
from monarch_agents import messages as m
from monarch_agents.transport import JobKeys, Mailbox, PeerLost

pytestmark = pytest.mark.timeout(60)

T = 10
NOTHING_S = 0.5
#: An address no mailbox here binds (port 1): only our fake listeners answer for it.
FAKE_ADDR = "tcp://127.0.0.1:1"


class Box:
    def __init__(self, keys: JobKeys, name: str, bind_port: int = 0):
        self.received: queue.Queue = queue.Queue()
        self.lost: queue.Queue = queue.Queue()
        self.ctx = zmq.Context()
        self.ctx.linger = 0
        self.mb = Mailbox(keys, self.received.put, self.lost.put, name=name, ctx=self.ctx, bind_port=bind_port)
        self.addr = self.mb.start()

    def close(self) -> None:
        self.mb.close()
        self.ctx.destroy(linger=0)


@pytest.fixture
def box():
    made: list[Box] = []

    def make(keys: JobKeys, name: str = "box") -> Box:
        b = Box(keys, name)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def _ping(addr: str, port_id: int = 1) -> m.Ping:
    return m.Ping(m.PortRef(addr, port_id))


def _raw_connect(addr: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(T)
    s.connect(ipc.socket_name(addr))
    return s


def _read_to_eof(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def _hello(keys: JobKeys, addr: str, nonce: bytes = b"n" * 16) -> bytes:
    name = ipc.socket_name(addr)
    return ipc._hello_bytes(keys, name, nonce)


def _frame(msg) -> bytes:
    """``msg`` framed as a link carries it (no descriptors)."""
    frames = [bytes(f) for f in transport.wire.encode(msg)]
    head = ipc._PREFIX.pack(len(frames), 0) + b"".join(ipc._LEN.pack(len(f)) for f in frames)
    return head + b"".join(frames)


def test_a_raw_peer_without_the_hello_is_cut_off(box):
    keys = JobKeys.generate()
    server = box(keys, "server")
    s = _raw_connect(server.addr)
    try:
        s.sendall(_frame(_ping("tcp://127.0.0.1:2")))  # a well-formed message, but no hello first
        assert _read_to_eof(s) == b""  # closed without a word
    finally:
        s.close()
    with pytest.raises(queue.Empty):
        server.received.get(timeout=NOTHING_S)
    assert server.mb.stats_received == 0


def test_a_hello_with_the_wrong_key_is_cut_off_and_the_right_one_admitted(box):
    keys = JobKeys.generate()
    server = box(keys, "server")
    other = JobKeys.generate()
    for wrong in (JobKeys(keys.server_public, keys.server_secret, other.client_public, other.client_secret),
                  JobKeys(other.server_public, keys.server_secret, keys.client_public, keys.client_secret)):
        s = _raw_connect(server.addr)
        try:
            s.sendall(_hello(wrong, server.addr) + _frame(_ping("tcp://127.0.0.1:2")))
            assert _read_to_eof(s) == b""
        finally:
            s.close()
    # A hello made for another listener is refused too (it cannot be replayed elsewhere).
    s = _raw_connect(server.addr)
    try:
        s.sendall(_hello(keys, FAKE_ADDR) + _frame(_ping("tcp://127.0.0.1:2")))
        assert _read_to_eof(s) == b""
    finally:
        s.close()
    with pytest.raises(queue.Empty):
        server.received.get(timeout=NOTHING_S)
    # The right hello is welcomed, and then the message is read.
    s = _raw_connect(server.addr)
    try:
        nonce = os.urandom(16)
        s.sendall(_hello(keys, server.addr, nonce) + _frame(_ping("tcp://127.0.0.1:2", 5)))
        welcome = s.recv(ipc._WELCOME.size)
        assert welcome == ipc._WELCOME.pack(ipc._WELCOME_MAGIC, ipc._welcome_mac(keys, nonce))
        assert server.received.get(timeout=T) == _ping("tcp://127.0.0.1:2", 5)
    finally:
        s.close()


def test_broken_framing_closes_the_link_and_the_mailbox_keeps_working(box):
    keys = JobKeys.generate()
    server = box(keys, "server")
    s = _raw_connect(server.addr)
    try:
        s.sendall(_hello(keys, server.addr))
        s.recv(ipc._WELCOME.size)
        s.sendall(ipc._PREFIX.pack(0, 0))  # a message of no frames
        assert _read_to_eof(s) == b""
    finally:
        s.close()
    s = _raw_connect(server.addr)
    try:
        s.sendall(_hello(keys, server.addr))
        s.recv(ipc._WELCOME.size)
        s.sendall(ipc._PREFIX.pack(2, 1) + ipc._LEN.pack(1) + ipc._LEN.pack(1) + b"xy")  # a descriptor that never came
        assert _read_to_eof(s) == b""
    finally:
        s.close()
    friend = box(keys, "friend")
    friend.mb.send(server.addr, _ping(friend.addr, 3))
    assert server.received.get(timeout=T) == _ping(friend.addr, 3)


class FakeListener:
    """A raw listener answering for FAKE_ADDR: records what it is sent, welcomes as told."""

    def __init__(self, welcome: bytes | None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(ipc.socket_name(FAKE_ADDR))
        self.sock.listen(4)
        self.got = b""
        self.welcome = welcome
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(T)
            while len(self.got) < ipc._HELLO.size:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                self.got += chunk
            if self.welcome is not None:
                conn.sendall(self.welcome)
            try:
                while chunk := conn.recv(65536):  # until the mailbox hangs up
                    self.got += chunk
            except OSError:
                pass

    def close(self) -> None:
        self.thread.join(timeout=T)
        self.sock.close()


def test_a_listener_that_cannot_prove_the_job_gets_no_message(box, monkeypatch):
    monkeypatch.setattr(transport, "_CONNECT_DEADLINE_S", 0.3)
    keys = JobKeys.generate()
    fake = FakeListener(welcome=ipc._WELCOME.pack(ipc._WELCOME_MAGIC, b"\0" * 32))
    try:
        a = box(keys, "a")
        try:
            a.mb.send(FAKE_ADDR, m.Reply(1, 0, True, os.urandom(3 << 20)))  # with a segment, too
        except PeerLost:
            pass  # the bad welcome was read while the message was being encoded
        assert a.lost.get(timeout=T) == FAKE_ADDR
        with pytest.raises(PeerLost):
            a.mb.send(FAKE_ADDR, _ping(a.addr))
    finally:
        fake.close()
    assert len(fake.got) == ipc._HELLO.size  # the hello, and nothing else
    assert _busy_segments() == 0  # the queued message's segment was closed with the link


def test_a_listener_that_never_answers_is_given_up(box, monkeypatch):
    monkeypatch.setattr(transport, "_CONNECT_DEADLINE_S", 0.3)
    fake = FakeListener(welcome=None)
    try:
        a = box(JobKeys.generate(), "a")
        a.mb.send(FAKE_ADDR, _ping(a.addr))
        assert a.lost.get(timeout=T) == FAKE_ADDR
    finally:
        fake.close()
    assert len(fake.got) == ipc._HELLO.size


def _as_nobody(fn) -> int:
    """Run ``fn()`` in a forked child under another user id; its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


@needs_root
def test_another_user_cannot_connect(box):
    keys = JobKeys.generate()
    server = box(keys, "server")

    def attempt() -> int:
        s = _raw_connect(server.addr)
        try:
            s.sendall(_hello(keys, server.addr) + _frame(_ping("tcp://127.0.0.1:2")))
            return 0 if _read_to_eof(s) == b"" else 3  # even with the keys: no welcome
        except (BrokenPipeError, ConnectionResetError):  # closed before we were done
            return 0

    assert _as_nobody(attempt) == 0
    with pytest.raises(queue.Empty):
        server.received.get(timeout=NOTHING_S)


@needs_root
def test_nothing_is_sent_to_another_users_listener(box, monkeypatch):
    monkeypatch.setattr(transport, "_CONNECT_DEADLINE_S", 0.3)
    r, w = os.pipe()

    def listen() -> int:
        os.close(r)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(ipc.socket_name(FAKE_ADDR))
        s.listen(4)
        os.write(w, b"ready")
        conn, _ = s.accept()
        conn.settimeout(T)
        got = _read_to_eof(conn)
        os.write(w, str(len(got)).encode())
        return 0

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            code = listen()
        finally:
            os._exit(code)
    os.close(w)
    try:
        assert os.read(r, 5) == b"ready"
        a = box(JobKeys.generate(), "a")
        a.mb.send(FAKE_ADDR, _ping(a.addr))  # refused there; TCP to port 1 then fails too
        assert a.lost.get(timeout=T) == FAKE_ADDR
        assert os.read(r, 16) == b"0"  # not even the hello
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_a_dead_peer_leaves_no_segment_behind(box):
    keys = JobKeys.generate()
    a, b = box(keys, "a"), box(keys, "b")
    a.mb.send(b.addr, _ping(a.addr))
    assert b.received.get(timeout=T)
    busy = _busy_segments()
    b.mb.close()  # b goes away with messages still coming its way
    for _ in range(20):
        try:
            a.mb.send(b.addr, m.Reply(1, 0, True, m.Pickled.of(os.urandom(2 << 20))))
        except PeerLost:
            break
    assert a.lost.get(timeout=T) == b.addr
    done = threading.Event()
    a.mb.call_soon(done.set)  # after the IO thread's turn that closed the link
    assert done.wait(T)
    assert _busy_segments() == busy


def _busy_segments() -> int:
    """Descriptors of shared-memory segments in use here: all of them, less those kept for reuse."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:monarch")
        except OSError:
            pass
    return n - sum(shm.pool().statistics()[k] for k in ("idle_segments", "mapped_segments"))


def test_a_new_process_on_a_dead_ones_port_is_not_taken_for_it(box):
    """Ports are reused soon (no TCP connection lingers on them): the address names the process."""
    keys = JobKeys.generate()
    a, b = box(keys, "a"), box(keys, "b")
    port = int(transport.zmq_endpoint(b.addr).rsplit(":", 1)[1])
    b.close()
    c = Box(keys, "c", bind_port=port)
    try:
        assert transport.zmq_endpoint(c.addr) == transport.zmq_endpoint(b.addr) and c.addr != b.addr
        with pytest.raises(PeerLost):
            a.mb.send(b.addr, _ping(a.addr))  # b is gone, and said so at once
        assert a.lost.get(timeout=T) == b.addr
        a.mb.send(c.addr, _ping(a.addr, 9))
        assert c.received.get(timeout=T) == _ping(a.addr, 9)
        with pytest.raises(queue.Empty):
            c.received.get(timeout=0.05)  # nothing meant for b reached c
    finally:
        c.close()


SEND_AND_EXIT = r"""
import json, sys
from monarch_agents import messages as m
from monarch_agents.transport import JobKeys, Mailbox
keys = JobKeys(**json.loads(sys.argv[1]))
mb = Mailbox(keys, lambda msg: None, name="fleeting")
mb.start()
mb.send(sys.argv[2], m.Ping(m.PortRef(mb.addr, 42)))
"""  # and exits at once, before the link's handshake is done


def test_send_then_exit_delivers(box):
    """What a process sent just before it exited arrives, as ZeroMQ's linger promises for TCP."""
    import json
    import subprocess
    import sys

    keys = JobKeys.generate()
    server = box(keys, "server")
    for _ in range(3):
        subprocess.run([sys.executable, "-c", SEND_AND_EXIT, json.dumps(keys.as_dict()), server.addr],
                       check=True, timeout=30, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        got = server.received.get(timeout=T)
        assert isinstance(got, m.Ping) and got.reply.port_id == 42
