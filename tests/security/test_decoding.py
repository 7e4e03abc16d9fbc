"""Decode amplification (issue #24, finding 6): what a proc's key (any rank or actor) can make a host
agent or a client allocate.  A message's type and its sender's role are checked before its body is
decoded, no constructor or opcode may allocate more than the body holds, and a proc's messages to a
host agent have a limit far below the client's."""

from __future__ import annotations

import queue
import struct

import psutil
import pytest
import zmq

from monarch_agents import ipc, wire
from monarch_agents import messages as m
from monarch_agents.keys import JobKeys
from monarch_agents.transport import Mailbox
from tests.agents.test_transport import Box
from tests.helpers import start_host_agent, wait_gone

pytestmark = pytest.mark.timeout(120)

T = 30
NOTHING_S = 1.0


def _frames(type_name: bytes, body: bytes) -> list[bytes]:
    return [struct.pack("!4sHI", wire.MAGIC, wire.VERSION, 0) + type_name, body]


#: 12 bytes of pickle that made the C unpickler grow its memo to 2**30 entries (16 GiB touched).
MEMO_BOMB = b"\x80\x05Nr" + (1 << 30).to_bytes(4, "little") + b"."
#: ``bytearray(1 GiB)`` through REDUCE: 35 bytes.
BYTEARRAY_BOMB = b"\x80\x05\x8c\x08builtins\x8c\tbytearray\x93J\x00\x00\x00@\x85R."


def _send_raw(box: Box, addr: str, frames: list[bytes]) -> None:
    p = box.mb._peer(addr)
    if isinstance(p, ipc.Link):
        p.send(frames, [])
    else:
        box.mb._send_zmq(addr, frames, p)


@pytest.fixture
def agent(tmp_path):
    keys = JobKeys.generate()
    a = start_host_agent(keys, tmp_path, hostname="decoding")
    yield keys, a
    a.stop()
    assert wait_gone([a.pid]) == []


@pytest.mark.parametrize("path", ["ipc", "tcp"])
def test_a_proc_key_cannot_make_a_host_agent_allocate_gigabytes(agent, path):
    keys, a = agent
    rank = Box(keys.for_procs(), "rank", local_ipc=path == "ipc")
    try:
        before = psutil.Process(a.pid).memory_info().rss
        ping = b"monarch_agents.messages:Ping"
        for body in (MEMO_BOMB, BYTEARRAY_BOMB):
            _send_raw(rank, a.addr, _frames(ping, body))
        # A type procs may not send, with a bomb for a body: refused on the header, never decoded.
        _send_raw(rank, a.addr, _frames(b"monarch_agents.messages:RunCommand", MEMO_BOMB))
        # And a header that lies about the body's type.
        _send_raw(rank, a.addr, [wire.encode(m.Ping(m.PortRef(rank.addr, 9)))[0],
                                 wire.encode(m.Reply(1, 0, True, None))[1]])
        # The agent still answers (a peer with a Unix socket: the agent answers one of its host there).
        pinger = Box(keys.for_procs(), "pinger")
        try:
            pinger.mb.send(a.addr, m.Ping(m.PortRef(pinger.addr, 7)))
            got = pinger.received.get(timeout=T)
            assert isinstance(got, m.Reply) and got.port_id == 7
        finally:
            pinger.close()
        assert psutil.Process(a.pid).memory_info().rss - before < 200 << 20
    finally:
        rank.close()


def test_the_envelope_unpickler_names_no_allocating_constructor():
    with pytest.raises(wire.WireError, match="may not name builtins.bytearray"):
        wire.decode(_frames(b"", BYTEARRAY_BOMB))
    with pytest.raises(wire.WireError, match="not one monarch writes"):
        wire.check_pickle(MEMO_BOMB)
    for big_length in (b"\x80\x05\x8e" + (1 << 40).to_bytes(8, "little") + b".",  # BINBYTES8
                       b"\x80\x05\x95" + (1 << 40).to_bytes(8, "little") + b"N."):  # FRAME
        with pytest.raises(wire.WireError):
            wire.check_pickle(big_length)
    # What monarch itself writes passes the check.
    for v in (1, "x", b"y" * 100_000, {"a": (1, 2.0)}, {1, 2}, frozenset([3]), complex(1, 2), bytearray(b"ab")):
        frames = wire.encode(m.Reply(1, 0, True, v))
        wire.check_pickle(frames[1])
        assert wire.decode(frames, check=True).payload == v


@pytest.mark.parametrize("path", ["ipc", "tcp"])
def test_a_proc_keys_messages_to_a_host_agent_have_a_lower_limit(path, monkeypatch):
    monkeypatch.setattr(wire, "PROC_MAX_FRAME_BYTES", 1 << 20)
    keys = JobKeys.generate()
    got: queue.Queue = queue.Queue()
    ctx = zmq.Context()
    host = Mailbox(keys, got.put, name="host-like", ctx=ctx, host=True, local_ipc=path == "ipc")
    host.start()
    rank = Box(keys.for_procs(), "rank", local_ipc=path == "ipc")
    client = Box(keys, "client", local_ipc=path == "ipc")
    try:
        rank.mb.send(host.addr, m.Reply(1, 0, True, b"x" * (2 << 20)))
        with pytest.raises(queue.Empty):
            got.get(timeout=NOTHING_S)
        client.mb.send(host.addr, m.Reply(2, 0, True, b"y" * (2 << 20)))
        assert got.get(timeout=T).port_id == 2
    finally:
        for b in (rank, client):
            b.close()
        host.close()
        ctx.destroy(linger=0)
