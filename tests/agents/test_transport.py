"""The transport: who may talk, peers that die, big messages, bad addresses.

Every test that uses ``boxes`` runs twice: once between peers that reach each
other through Unix sockets (``ipc``, as on one host), once through CURVE TCP
(``tcp``, as between hosts).
"""

from __future__ import annotations

import os
import queue
import threading

import pytest
import zmq

from monarch_agents import messages as m
from monarch_agents import ipc, transport, wire
from monarch_agents.future import Future
from monarch_agents.runtime import OneShot
from monarch_agents.transport import JobKeys, Mailbox, PeerLost, addr_host, is_same_host
from tests.helpers import start_host_agent

pytestmark = pytest.mark.timeout(60)

NOTHING_S = 0.5  # how long "nothing arrives" is watched for
T = 10


class Box:
    """A started mailbox in a ZeroMQ context of its own, with what it received."""

    def __init__(self, keys: JobKeys, name: str, local_ipc: bool = True):
        self.received: queue.Queue = queue.Queue()
        self.lost: queue.Queue = queue.Queue()
        self.ctx = zmq.Context()
        self.ctx.linger = 0  # as transport.context() bounds it; the default waits forever in term()
        self.mb = Mailbox(keys, self.received.put, self.lost.put, name=name, ctx=self.ctx, local_ipc=local_ipc)
        self.addr = self.mb.start()

    def close(self) -> None:
        self.mb.close()
        self.ctx.destroy(linger=0)


@pytest.fixture(params=["ipc", "tcp"])
def boxes(request):
    made: list[Box] = []

    def make(keys: JobKeys, name: str = "box") -> Box:
        b = Box(keys, name, local_ipc=request.param == "ipc")
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def _other_client(keys: JobKeys) -> JobKeys:
    """The job's server keys with a client key pair the server does not know."""
    other = JobKeys.generate()
    return JobKeys(keys.server_public, keys.server_secret, other.client_public, other.client_secret)


def _ping(addr: str, port_id: int = 1) -> m.Ping:
    return m.Ping(m.PortRef(addr, port_id))


def test_authenticated_peers_exchange_messages(boxes, request):
    keys = JobKeys.generate()
    a, b = boxes(keys, "a"), boxes(keys, "b")
    a.mb.send(b.addr, _ping(a.addr, 7))
    got = b.received.get(timeout=T)
    assert got == _ping(a.addr, 7)
    b.mb.send(got.reply.addr, m.Reply(7, 0, True, "pong"))
    assert a.received.get(timeout=T) == m.Reply(7, 0, True, "pong")
    # The path under test is the one taken.
    kind = "Link" if request.node.callspec.params["boxes"] == "ipc" else "_Peer"
    assert type(a.mb._peers[b.addr]).__name__ == kind


def test_many_senders_keep_order_and_lose_nothing(boxes):
    """More than a socket buffer holds, from several threads at once: queued, drained, in order."""
    keys = JobKeys.generate()
    a, b = boxes(keys, "a"), boxes(keys, "b")
    n, senders = 5000, 4
    payload = os.urandom(2000)

    def send(k: int) -> None:
        for i in range(n):
            a.mb.send(b.addr, m.Reply(k, i, True, payload))

    threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = {k: [] for k in range(senders)}
    for _ in range(n * senders):
        r = b.received.get(timeout=T)
        seen[r.port_id].append(r.rank)
        assert r.payload == payload
    assert all(ranks == list(range(n)) for ranks in seen.values())


def test_wrong_client_key_gets_nothing(boxes, monkeypatch):
    monkeypatch.setattr(transport, "_CONNECT_DEADLINE_S", 0.3)
    keys = JobKeys.generate()
    server = boxes(keys, "server")
    intruder = boxes(_other_client(keys), "intruder")
    try:
        intruder.mb.send(server.addr, _ping(intruder.addr))
    except PeerLost:
        # ipc: the link is made (and its hello written) before the message; the server may refuse
        # and end it first, and a write to an ended link says PeerLost: the same refusal, seen sooner.
        pass
    with pytest.raises(queue.Empty):
        server.received.get(timeout=NOTHING_S)
    assert server.mb.stats_received == 0
    # The intruder never completes the handshake, so it is told the peer is gone ...
    assert intruder.lost.get(timeout=T) == server.addr
    with pytest.raises(PeerLost):
        intruder.mb.send(server.addr, _ping(intruder.addr))
    # ... while the right key goes through.
    friend = boxes(keys, "friend")
    friend.mb.send(server.addr, _ping(friend.addr, 2))
    assert server.received.get(timeout=T) == _ping(friend.addr, 2)
    with pytest.raises(queue.Empty):
        server.received.get(timeout=0.05)  # and the intruder's message never shows up


def test_wrong_server_key_gets_nothing(boxes):
    keys = JobKeys.generate()
    server = boxes(keys, "server")
    other = JobKeys.generate()
    # A client that trusts another server key (and so cannot complete the handshake).
    confused = boxes(JobKeys(other.server_public, keys.server_secret, keys.client_public, keys.client_secret), "c")
    try:
        confused.mb.send(server.addr, _ping(confused.addr))
    except PeerLost:
        pass  # ipc: the server refused and ended the link before the message was written (as above)
    with pytest.raises(queue.Empty):
        server.received.get(timeout=NOTHING_S)


def test_plain_socket_without_curve_gets_nothing(boxes):
    keys = JobKeys.generate()
    server = boxes(keys, "server")
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    try:
        s.connect(transport.zmq_endpoint(server.addr))
        s.send_multipart(wire.encode(_ping("tcp://127.0.0.1:1")), zmq.NOBLOCK)
        with pytest.raises(queue.Empty):
            server.received.get(timeout=NOTHING_S)
    finally:
        s.close(0)
        ctx.destroy(linger=0)


def test_wrong_key_against_a_live_agent(client, tmp_path):
    """A raw peer with the wrong key asks the agent for a Ping answer: none comes. The right key gets one."""
    rt = client
    agent = start_host_agent(rt.keys, tmp_path, hostname="guarded")
    ctx = zmq.Context()
    try:
        # The members' server key does not open a host agent either: it listens with the host agents' own.
        for client_keys, server_key, answered in ((_other_client(rt.keys), rt.keys.host_public, False),
                                                  (rt.keys, rt.keys.server_public, False),
                                                  (rt.keys, rt.keys.host_public, True)):
            s = ctx.socket(zmq.DEALER)
            s.curve_serverkey = server_key.encode()
            s.curve_publickey = client_keys.client_public.encode()
            s.curve_secretkey = client_keys.client_secret.encode()
            s.connect(transport.zmq_endpoint(agent.addr))
            fut: Future = Future()
            port = rt.open_port(OneShot(rt, fut), (agent.addr,))
            s.send_multipart(wire.encode(m.Ping(port)))
            if answered:
                assert fut.get(timeout=T).pid == agent.pid
            else:
                with pytest.raises(TimeoutError):
                    fut.get(timeout=NOTHING_S * 2)
                rt.close_port(port.port_id)
            s.close(0)
    finally:
        ctx.destroy(linger=0)
        agent.stop()


def test_peer_death_is_reported_and_its_socket_closed(boxes):
    keys = JobKeys.generate()
    a, b = boxes(keys, "a"), boxes(keys, "b")
    a.mb.send(b.addr, _ping(a.addr))
    assert b.received.get(timeout=T)
    b.mb.close()  # b goes away: its connection closes
    assert a.lost.get(timeout=T) == b.addr
    assert b.addr in a.mb.dead
    with pytest.raises(PeerLost):
        a.mb.send(b.addr, _ping(a.addr))
    done = threading.Event()
    a.mb.call_soon(done.set)  # after the IO thread's turn that handled the loss
    assert done.wait(T)
    assert b.addr not in a.mb._peers  # the dead peer's sockets are released


def test_unreachable_peer_is_declared_dead(boxes, monkeypatch):
    monkeypatch.setattr(transport, "_CONNECT_DEADLINE_S", 0.2)
    a = boxes(JobKeys.generate(), "a")
    nowhere = "tcp://127.0.0.1:1"
    a.mb.send(nowhere, _ping(a.addr))  # queued: ZeroMQ keeps trying to connect
    assert a.lost.get(timeout=T) == nowhere
    with pytest.raises(PeerLost):
        a.mb.send(nowhere, _ping(a.addr))
    assert nowhere not in a.mb._peers


def test_malformed_addresses_raise_and_leave_the_mailbox_working(boxes):
    keys = JobKeys.generate()
    a, b = boxes(keys, "a"), boxes(keys, "b")
    # More tries than the context has sockets (1023): each one cleans up after itself.
    for i in range(1200):
        with pytest.raises(zmq.ZMQError):
            a.mb.send(f"tcp:/bad{i}", _ping(a.addr))
    a.mb.send(b.addr, _ping(a.addr))
    assert b.received.get(timeout=T) == _ping(a.addr)


@pytest.mark.parametrize("segments", [False, True])
def test_big_messages_arrive_intact(boxes, segments):
    keys = JobKeys.generate()
    a, b = boxes(keys, "a"), boxes(keys, "b")
    peer = a.mb._peer(b.addr)
    if isinstance(peer, ipc.Link):
        peer.same_host = segments  # through the socket, or shared memory
    elif segments:
        pytest.skip("shared memory is for peers on one host")
    blob = bytearray(os.urandom(8 << 20))
    a.mb.send(b.addr, m.Reply(1, 0, True, m.Pickled.of(bytes(blob))))
    blob[:] = b"\0" * len(blob)  # send returned: the buffer is ours again
    got = b.received.get(timeout=T)
    assert got.payload.load() != bytes(blob)
    assert len(got.payload.load()) == 8 << 20


def test_call_soon_and_call_later_run_on_the_io_thread(boxes):
    a = boxes(JobKeys.generate(), "a")
    seen: queue.Queue = queue.Queue()
    a.mb.call_later(0.05, lambda: seen.put(("later", threading.current_thread().name)))
    a.mb.call_soon(lambda: seen.put(("soon", threading.current_thread().name)))
    a.mb.call_soon(lambda: 1 / 0)  # a failing callback is logged, not fatal
    got = [seen.get(timeout=T), seen.get(timeout=T)]
    assert got == [("soon", "a-io"), ("later", "a-io")]


def test_addresses():
    assert addr_host("tcp://10.1.2.3:5000") == "10.1.2.3"
    assert addr_host("tcp://[::1]:5000") == "::1"
    assert is_same_host("tcp://127.0.0.1:1")
    assert is_same_host("tcp://[::1]:1")
    assert not is_same_host("tcp://192.0.2.1:1")  # TEST-NET: never this machine
    assert not is_same_host("tcp://some-host:1")
    assert transport.route_ip("127.0.0.1") == "127.0.0.1"


def test_job_keys_are_distinct():
    a, b = JobKeys.generate(), JobKeys.generate()
    assert a != b and a.server_public != a.client_public
    assert len(a.server_public) == 40 and len(a.client_secret) == 40
