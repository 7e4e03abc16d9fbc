"""Big buffers between hosts over bulk streams (monarch_agents/bulk.py): intact, in order, authenticated,
and a peer killed in the middle of one gives an error, not a hang.

Peers here reach each other over CURVE TCP (``local_ipc=False``), as between hosts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from monarch_agents import bulk, shm
from monarch_agents import messages as m
from monarch_agents.transport import JobKeys, PeerLost
from tests.agents.test_transport import Box

pytestmark = pytest.mark.timeout(120)

T = 30
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if bulk.sodium() is None or bulk.STREAMS == 0:
    pytest.skip("no libsodium, or the bulk path is turned off", allow_module_level=True)


@pytest.fixture
def pair():
    keys = JobKeys.generate()
    a, b = Box(keys, "a", local_ipc=False), Box(keys, "b", local_ipc=False)
    yield a, b
    a.close()
    b.close()


def _big(*sizes: int) -> m.Reply:
    return m.Reply(1, 0, True, m.Pickled.of([os.urandom(n) for n in sizes] + ["small"]))


def test_big_buffers_go_by_bulk_streams_and_arrive_intact(pair):
    a, b = pair
    sent = _big((4 << 20) + 1, 1 << 20, (3 << 20) + 7, 100)  # odd sizes: a short last chunk in each
    a.mb.send(b.addr, sent)
    got = b.received.get(timeout=T)
    assert got.payload.load() == sent.payload.load()
    assert a.mb._outbox is not None and len(b.mb._fetched_ids) == 1  # the path under test was taken
    assert not b.mb._held
    # Received bytes are the delivered objects themselves (filled in place, not copied after).
    [buf] = [x for x in got.payload.buffers if memoryview(x).nbytes == (4 << 20) + 1]
    assert type(memoryview(buf).obj.made_bytes) is bytes


def test_messages_after_a_bulk_one_wait_for_it(pair, monkeypatch):
    a, b = pair
    fetch = bulk.Inbox.fetch

    def slow_fetch(self, *args):
        fetch(self, *args)
        time.sleep(0.5)  # acknowledged, not yet delivered: what follows must still wait behind it

    monkeypatch.setattr(bulk.Inbox, "fetch", slow_fetch)
    a.mb.send(b.addr, m.Reply(1, 0, True, m.Pickled.of(os.urandom(8 << 20))))
    for i in range(2, 20):
        a.mb.send(b.addr, m.Reply(i, 0, True, "small"))
    a.mb.send(b.addr, m.Reply(20, 0, True, m.Pickled.of(os.urandom(5 << 20))))
    a.mb.send(b.addr, m.Reply(21, 0, True, "small"))
    assert [b.received.get(timeout=T).port_id for _ in range(21)] == list(range(1, 22))


def test_a_receiver_that_cannot_fetch_gets_the_message_on_curve(pair, monkeypatch):
    a, b = pair

    def unreachable(self, desc, host, dsts):
        raise bulk.BulkError("no route (test)")

    monkeypatch.setattr(bulk.Inbox, "fetch", unreachable)
    monkeypatch.setattr(bulk, "CONNECT_S", 0.5)
    sent = _big(6 << 20)
    a.mb.send(b.addr, sent)
    assert b.received.get(timeout=T).payload.load() == sent.payload.load()
    assert b.addr in a.mb._no_bulk  # it never connected: the next big ones go on CURVE at once
    a.mb.send(b.addr, sent)
    assert b.received.get(timeout=T).payload.load() == sent.payload.load()


def test_a_copy_resent_after_a_whole_fetch_is_dropped(pair):
    a, b = pair
    sent = _big(5 << 20)
    a.mb.send(b.addr, sent)
    b.received.get(timeout=T)
    [tid] = b.mb._fetched_ids
    desc = bulk.Descriptor(tid, b"\0" * 32, 1, 1, 1, [(2, 0)])
    from monarch_agents import wire

    a.mb._send_small(b.addr, bulk.inline_frames(desc, wire.encode(sent)), a.mb._peers[b.addr])
    a.mb.send(b.addr, m.Reply(9, 0, True, "after"))
    assert b.received.get(timeout=T).port_id == 9


def test_a_wrong_key_fails_authentication_and_nothing_is_delivered():
    s = bulk.sodium()
    out = bulk.Outbox("t")
    inbox = bulk.Inbox()
    try:
        data = os.urandom((2 << 20) + 5)
        result: dict = {}
        descs: list = []

        def send_small(frames):
            descs.append(bulk.parse(frames[0], len(frames) - 1, 1 << 30))

        th = threading.Thread(target=lambda: result.setdefault(
            "r", out.send("peer", "127.0.0.1", [b"h", b"b", data], [2], send_small, lambda: True)))
        th.start()
        while not descs:
            time.sleep(0.01)
        d = descs[0]
        wrong = bulk.Descriptor(d.tid, bytes(32), s.preferred, d.streams, d.port, d.big)
        _, dst = shm.new_bytes(len(data))
        with pytest.raises(bulk.BulkError, match="failed authentication"):
            inbox.fetch(wrong, "127.0.0.1", [dst])
        th.join(T)
        assert result["r"][0]  # the sender was told it failed
    finally:
        out.close()
        inbox.close()


def test_idle_and_unknown_connections_to_the_bulk_port_do_not_hold_a_transfer(pair, monkeypatch):
    a, b = pair
    monkeypatch.setattr(bulk, "HELLO_S", 0.5)
    a.mb.send(b.addr, _big(4 << 20))  # opens the bulk port
    b.received.get(timeout=T)
    [(ip, lst)] = a.mb._outbox._listeners.items()
    port = lst.getsockname()[1]
    idle = [socket.create_connection((ip, port)) for _ in range(5)]
    junk = socket.create_connection((ip, port))
    junk.sendall(os.urandom(17))  # a transfer id nobody sent
    assert junk.recv(1) == b""  # closed at once
    sent = _big(6 << 20)
    a.mb.send(b.addr, sent)
    assert b.received.get(timeout=T).payload.load() == sent.payload.load()
    for c in idle:
        c.settimeout(T)
        assert c.recv(1) == b""  # closed by the hello deadline
        c.close()
    junk.close()


_CHILD = """
import json, os, sys, time
sys.path.insert(0, {repo!r})
from monarch_agents import bulk, messages as m
from monarch_agents.transport import JobKeys
from tests.agents.test_transport import Box
keys = JobKeys(**json.loads(sys.stdin.readline()))
box = Box(keys, "child", local_ipc=False)
calls = [0]
def die_after(n):
    calls[0] += 1
    if calls[0] > n:
        os._exit(9)
{patch}
print(box.addr, flush=True)
{body}
time.sleep(60)
"""


def _child(keys: JobKeys, patch: str, body: str = "") -> tuple[subprocess.Popen, str]:
    src = _CHILD.format(repo=REPO, patch=textwrap.dedent(patch), body=textwrap.dedent(body))
    p = subprocess.Popen([sys.executable, "-c", src], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         cwd=REPO)
    p.stdin.write(json.dumps(keys.as_dict()) + "\n")
    p.stdin.flush()
    return p, p.stdout.readline().strip()


def test_a_receiver_killed_mid_transfer_is_reported_not_waited_for():
    keys = JobKeys.generate()
    a = Box(keys, "a", local_ipc=False)
    # The child dies once it has read a few chunks of the transfer.
    p, addr = _child(keys, """
        recv = bulk._recv_exactly
        def _recv(c, v):
            die_after(6)
            recv(c, v)
        bulk._recv_exactly = _recv
    """)
    try:
        assert addr
        t0 = time.monotonic()
        try:  # returns (what is lost is told by on_peer_lost, as for any one-way message) or raises
            a.mb.send(addr, _big(32 << 20))
        except PeerLost:
            pass
        assert time.monotonic() - t0 < T
        assert p.wait(T) == 9
        assert a.lost.get(timeout=T) == addr
        with pytest.raises(PeerLost):
            a.mb.send(addr, _big(32 << 20))
    finally:
        p.kill()
        p.wait()
        a.close()


def test_a_sender_killed_mid_transfer_delivers_nothing_and_holds_nothing():
    keys = JobKeys.generate()
    b = Box(keys, "b", local_ipc=False)
    other = Box(keys, "other", local_ipc=False)
    # The child sends a big message to b and dies after sealing a few chunks of it.
    p, _ = _child(keys, """
        enc_stream = bulk.Outbox._stream
        def _stream(self, t, k, c):
            orig = c.sendall
            class C:
                def __getattr__(self, name):
                    return getattr(c, name)
                def sendall(self, data):
                    die_after(4)
                    orig(data)
            enc_stream(self, t, k, C())
        bulk.Outbox._stream = _stream
    """, f"""
        box.mb.send({b.addr!r}, m.Reply(1, 0, True, m.Pickled.of(os.urandom(32 << 20))))
    """)
    try:
        assert p.wait(T) == 9
        deadline = time.monotonic() + T
        while b.mb._held and time.monotonic() < deadline:  # the fetch fails at the stream's end
            time.sleep(0.05)
        assert not b.mb._held
        assert b.received.empty()
        other.mb.send(b.addr, m.Reply(2, 0, True, "still works"))
        assert b.received.get(timeout=T).port_id == 2
        assert not [t for t in threading.enumerate() if t.name.endswith("bulk-in")]
    finally:
        p.kill()
        p.wait()
        other.close()
        b.close()


# -- big messages on the CURVE connection itself (no bulk path): in pieces ------------------------


def test_without_the_bulk_path_big_messages_go_in_pieces_intact_and_in_order(pair, monkeypatch):
    from monarch_agents import transport

    a, b = pair
    monkeypatch.setattr(bulk, "STREAMS", 0)
    monkeypatch.setattr(transport, "_PIECE_BYTES", 64 << 10)  # many pieces, some frames end mid-piece
    sent = _big((9 << 20) + 1, 1 << 20, 100, (2 << 20) + 7)
    sends = []
    real = transport._pieces
    monkeypatch.setattr(transport, "_pieces", lambda frames: sends.append(real(frames)) or sends[-1])
    a.mb.send(b.addr, sent)
    a.mb.send(b.addr, m.Reply(2, 0, True, "after"))
    got = b.received.get(timeout=T)
    assert got.payload.load() == sent.payload.load()
    assert b.received.get(timeout=T).port_id == 2
    assert len(sends[0]) > 100 and not b.mb._fetched_ids and not b.mb._assembling


def test_a_piece_without_its_head_or_a_head_with_too_many_bytes_is_dropped(pair):
    from monarch_agents import transport

    a, b = pair
    a.mb.send(b.addr, m.Reply(1, 0, True, "hello"))  # connected
    b.received.get(timeout=T)
    p = a.mb._peers[b.addr]
    a.mb._send_small(b.addr, [transport._PIECE, b"x" * 10], p)
    head = transport._PIECES.pack(transport._PIECES_HEAD, 1) + (5).to_bytes(8, "big")
    a.mb._send_small(b.addr, [head, b"MNRC"], p)
    a.mb._send_small(b.addr, [transport._PIECE, b"y" * 6], p)  # one byte more than announced
    a.mb.send(b.addr, m.Reply(3, 0, True, "still works"))
    assert b.received.get(timeout=T).port_id == 3
    assert b.mb.stats_dropped == 2 and not b.mb._assembling


def test_a_message_in_pieces_whose_sender_stops_midway_is_dropped_not_kept(pair, monkeypatch):
    from monarch_agents import transport

    a, b = pair
    monkeypatch.setattr(transport, "_ASSEMBLY_STALL_S", 0.4)
    a.mb.send(b.addr, m.Reply(1, 0, True, "hello"))  # connected
    b.received.get(timeout=T)
    head = transport._PIECES.pack(transport._PIECES_HEAD, 1) + (64 << 20).to_bytes(8, "big")
    a.mb._send_small(b.addr, [head, b"MNRC"], a.mb._peers[b.addr])
    a.mb._send_small(b.addr, [transport._PIECE, b"z" * 1000], a.mb._peers[b.addr])
    deadline = time.monotonic() + T
    while not b.mb.stats_dropped and time.monotonic() < deadline:  # the head arrives, then is given up on
        time.sleep(0.05)
    assert not b.mb._assembling and b.mb.stats_dropped == 1
    a.mb.send(b.addr, m.Reply(2, 0, True, "still works"))
    assert b.received.get(timeout=T).port_id == 2


_SLOW_LINK = """
import os, sys, time, queue
sys.path.insert(0, {repo!r})
from monarch_agents import bulk, transport, messages as m
from monarch_agents.transport import JobKeys
from tests.agents.test_transport import Box
bulk.STREAMS = 0  # the CURVE path, as to a peer that cannot reach a bulk port
transport._HEARTBEAT_IVL_MS, transport._HEARTBEAT_TIMEOUT_MS = 250, 2000
transport._PIECE_BYTES = {piece}
keys = JobKeys.generate()
a, b = Box(keys, "a", local_ipc=False), Box(keys, "b", local_ipc=False)
data = m.Reply(1, 0, True, m.Pickled.of(os.urandom(32 << 20)))  # ~4 s at 8 MB/s: twice the heartbeat timeout
a.mb.send(b.addr, data)
got, deadline = False, time.monotonic() + 30
while time.monotonic() < deadline:  # until it arrives, or the peer is declared lost (and 2 s more)
    try:
        got = b.received.get(timeout=0.2).payload.load() == data.payload.load()
        break
    except queue.Empty:
        if not a.lost.empty():
            deadline = min(deadline, time.monotonic() + 2)
print("DELIVERED" if got else "NOT DELIVERED", "LOST" if not a.lost.empty() else "ALIVE", flush=True)
a.close(); b.close()
"""


@pytest.mark.parametrize("piece,expect", [(256 << 10, "DELIVERED ALIVE"), (64 << 20, "NOT DELIVERED LOST")])
def test_a_big_message_on_a_slow_link_does_not_starve_the_heartbeat(piece, expect):
    """On loopback limited to 8 MB/s in a namespace of its own, with a 2 s heartbeat timeout: a 32 MiB
    message in pieces arrives and the peer stays alive; in one piece (as before) the heartbeat's
    answer waits behind it and the connection is declared dead.  (What the kernel's send buffer
    holds, up to 4 MiB, also comes before an answer: 0.5 s here.)"""
    import shutil

    if os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("ip") is None:
        pytest.skip("needs root, ip and tc (a rate-limited loopback in a network namespace)")
    ns = f"bulk-slow-{os.getpid()}-{piece}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        # MTU 1500: loopback's 64 KiB packets would not pass a token bucket of that burst.
        for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "link", "set", "lo", "mtu", "1500"],
                    ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "64mbit", "burst", "64kb", "latency", "200ms"]):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _SLOW_LINK.format(repo=REPO, piece=piece)],
                           capture_output=True, text=True, timeout=90, cwd=REPO)
        assert expect in r.stdout, r.stdout + r.stderr[-2000:]
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_peer_behind_a_relay_gets_big_messages_on_its_connection(pair):
    """A relayed address (a client outside a Kubernetes cluster) is not where its connections come
    from: a bulk fetch back to them would fail after CONNECT_S, so none is offered."""
    import queue

    import zmq

    from monarch_agents.transport import Mailbox, is_relayed

    a, _ = pair
    got: queue.Queue = queue.Queue()
    ctx = zmq.Context()
    relayed = Mailbox(a.mb.keys, got.put, name="relayed", ctx=ctx, advertise=lambda endpoint: endpoint)
    try:
        addr = relayed.start()
        assert is_relayed(addr)
        sent = _big(6 << 20)
        a.mb.send(addr, sent)
        assert got.get(timeout=T).payload.load() == sent.payload.load()
        assert a.mb._outbox is None and not relayed._fetched_ids
    finally:
        relayed.close()
        ctx.destroy(linger=0)
