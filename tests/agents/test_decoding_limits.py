"""What an authenticated peer still cannot do to a receiver: allocate without bound, SIGBUS it
through a shrinking segment, or make its receive loop import and call something."""

from __future__ import annotations

import collections
import os
import queue
import sys

import pytest

from monarch_agents import ipc, shm, wire
from monarch_agents import messages as m
from monarch_agents.transport import JobKeys
from tests.agents.test_ipc import _raw_connect, _read_to_eof, _hello, box  # noqa: F401  (fixture)
from tests.agents.test_transport import Box

pytestmark = pytest.mark.timeout(60)

T = 10
NOTHING_S = 0.5


def _ping(addr: str, port_id: int = 1) -> m.Ping:
    return m.Ping(m.PortRef(addr, port_id))


# --- the envelope unpickler -------------------------------------------------------------


class _Runs:
    """Would run ``touch <path>`` when unpickled by a plain unpickler."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def test_an_envelope_naming_a_function_is_dropped_without_calling_it(tmp_path):
    marker = tmp_path / "ran"
    frames = wire.encode(m.Reply(1, 0, True, _Runs(str(marker))))  # a payload that skipped its Pickled wrapper
    with pytest.raises(wire.WireError, match="may not name"):
        wire.decode(frames)
    assert not marker.exists()


@pytest.mark.parametrize("value", [collections.Counter("abc"), _Runs("/nonexistent/x")])
def test_user_values_inside_pickled_still_carry_any_class(value):
    msg = wire.decode(wire.encode(m.Reply(1, 0, True, m.Pickled.of(value))))
    assert isinstance(msg.payload, m.Pickled)  # not unpickled by the receive loop
    if isinstance(value, collections.Counter):
        assert msg.payload.load() == value


def test_an_envelope_may_name_a_message_type_of_a_module_already_imported_but_not_import_one():
    # This module is imported, so a message type of a plugged-in service defined here decodes ...
    msg = wire.decode(wire.encode(_Plugged(3)))
    assert type(msg) is _Plugged and msg.n == 3
    # ... but a class that is not a message does not, and no module is imported on a peer's say-so.
    body = wire.encode(m.Reply(1, 0, True, None))[1].replace(b"monarch_agents.messages", b"antigravity_msgs_x00abc")
    with pytest.raises(wire.WireError, match="may not name antigravity_msgs_x00abc.Reply"):
        wire.decode([wire.encode(m.Reply(1, 0, True, None))[0], body])
    assert "antigravity_msgs_x00abc" not in sys.modules
    with pytest.raises(wire.WireError, match="may not name"):
        wire.decode(wire.encode(m.Reply(1, 0, True, _NotAMessage())))


@m.message
class _Plugged(m.Message):
    n: int


class _NotAMessage:
    pass


def test_answers_keep_their_error_types():
    from monarch_agents.errors import ActorError, SupervisionError

    got = wire.decode(wire.encode(m.Reply(1, 2, False, SupervisionError("gone", rank=3, host="h", exit_code=9))))
    assert isinstance(got.payload, SupervisionError) and got.payload.exit_code == 9
    got = wire.decode(wire.encode(m.Reply(1, 2, False, RuntimeError("no"))))
    assert isinstance(got.payload, RuntimeError)
    err = wire.decode(wire.encode(m.Reply(1, 0, False, m.Pickled.of(ActorError(KeyError("k"), "tb")))))
    assert isinstance(err.payload.load().exception, KeyError)


# --- frame lengths -------------------------------------------------------------------------


def test_a_link_announcing_a_huge_frame_is_cut_off_before_buffering_it(box):  # noqa: F811
    keys = JobKeys.generate()
    server = box(keys, "server")
    s = _raw_connect(server.addr)
    try:
        s.sendall(_hello(keys, server.addr))
        s.recv(ipc._WELCOME.size)
        # Two frames, the second announced at 1 TiB: refused on the header alone.
        s.sendall(ipc._PREFIX.pack(2, 0) + ipc._LEN.pack(16) + ipc._LEN.pack(1 << 40) + b"x" * 16)
        assert _read_to_eof(s) == b""
    finally:
        s.close()
    friend = box(keys, "friend")  # and the mailbox still works
    friend.mb.send(server.addr, _ping(friend.addr, 3))
    assert server.received.get(timeout=T) == _ping(friend.addr, 3)


def test_a_tcp_peer_sending_more_than_the_limit_is_dropped(monkeypatch):
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 1 << 20)  # read by the receiver when it binds
    keys = JobKeys.generate()
    server, sender = Box(keys, "server", local_ipc=False), Box(keys, "sender", local_ipc=False)
    try:
        sender.mb.send(server.addr, m.Reply(1, 0, True, b"x" * (2 << 20)))
        with pytest.raises(queue.Empty):
            server.received.get(timeout=NOTHING_S * 2)
        # Under the limit, and from a fresh peer (ZeroMQ cut the old one off), it arrives.
        other = Box(keys, "other", local_ipc=False)
        try:
            other.mb.send(server.addr, m.Reply(1, 0, True, b"y" * (512 << 10)))
            assert server.received.get(timeout=T).payload == b"y" * (512 << 10)
        finally:
            other.close()
    finally:
        sender.close()
        server.close()


def test_a_segment_over_the_limit_is_refused(monkeypatch):
    fds: list[int] = []
    frames = wire.encode(m.Reply(1, 0, True, m.Pickled.of(b"z" * (2 << 20))), fds=fds)
    monkeypatch.setattr(wire, "MAX_FRAME_BYTES", 1 << 20)
    with pytest.raises(wire.WireError, match="limit"):
        wire.decode(frames, fds)


# --- shared-memory seals --------------------------------------------------------------------


def test_a_sent_segment_cannot_be_shrunk_by_its_sender():
    fds: list[int] = []
    frames = wire.encode(m.Reply(1, 0, True, m.Pickled.of(b"s" * (2 << 20))), fds=fds)
    [fd] = fds
    keep = os.dup(fd)  # what a hostile sender would keep
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(keep, 0)
        msg = wire.decode(frames, fds)
        assert msg.payload.load() == b"s" * (2 << 20)
    finally:
        os.close(keep)


def test_an_unsealed_segment_is_refused():
    fd = os.memfd_create("monarch", os.MFD_CLOEXEC)  # what a sender that skipped the seal would send
    os.ftruncate(fd, 2 << 20)
    frames = wire.encode(m.Reply(1, 0, True, None))
    header = wire._HEADER.pack(wire.MAGIC, wire.VERSION, 1) + bytes([wire._KIND_SEGMENT])
    with pytest.raises(wire.WireError, match="not sealed"):
        wire.decode([header, frames[1], wire._SEGMENT.pack(2 << 20)], [fd])  # decode closes fd


def test_recycled_segments_grow_but_never_shrink():
    pool = shm.Pool()
    a = pool.take(4 << 20)
    shm.seal(a)
    pool.give(a, 4 << 20)
    b = pool.take(1 << 20)  # a smaller one is wanted: the sealed 4 MiB one cannot be cut down
    assert b != a and os.fstat(b).st_size == 1 << 20
    shm.seal(b)
    pool.give(b, 1 << 20)
    c = pool.take(4 << 20)
    assert c == a
    d = pool.take(2 << 20)  # grows the 1 MiB one
    assert d == b and os.fstat(d).st_size == 2 << 20
    for fd in (c, d):
        os.close(fd)
    pool.clear()
