"""Framing and pickling: round trips, zero-copy and shared-memory paths, malformed input."""

from __future__ import annotations

import os
import pickle
import random
import struct

import numpy as np
import pytest
import torch
import zmq

from monarch_agents import messages as m
from monarch_agents import shm, transport, wire
from monarch_agents.future import Future
from monarch_agents.runtime import OneShot
from monarch.actor import Actor, endpoint, this_host
from tests.helpers import start_host_agent

pytestmark = pytest.mark.timeout(120)

T = 60


def _call(value, method: str = "echo") -> m.Call:
    return m.Call("actor-1", method, m.Pickled.of(((value,), {})), {"gpus": 1}, {"gpus": 4},
                  m.PortRef("tcp://127.0.0.1:5555", 7), 1, "tcp://127.0.0.1:6666")


def _roundtrip(value, same_host: bool = False):
    fds: list[int] | None = [] if same_host else None
    frames = wire.encode(_call(value), fds=fds)
    # What the receiver gets: bytes-like frames (ZeroMQ hands us read-only buffers).
    received = [memoryview(bytes(f)) if not isinstance(f, (bytes, bytearray)) else f for f in frames]
    msg = wire.decode(received, fds or ())
    assert isinstance(msg, m.Call)
    assert msg.point == {"gpus": 1} and msg.reply == m.PortRef("tcp://127.0.0.1:5555", 7)
    (got,), kwargs = msg.payload.load()
    assert kwargs == {}
    return got, frames


def _busy_segment_fds() -> int:
    """Descriptors of shared-memory segments in use here: all of them, less those kept for reuse.

    A segment an object is built on counts twice (ours, and its mapping's own).
    """
    return _memfds() - sum(shm.pool().statistics()[k] for k in ("idle_segments", "mapped_segments"))


def _memfds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:monarch")
        except OSError:
            pass
    return n


# -- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    None, 0, -1, 2**100, 3.5, float("inf"), "text", "ü" * 10, b"", b"small", bytearray(b"ba"),
    [1, [2, [3]]], {"a": (1, 2), 3: {4}}, frozenset({1}), range(3), complex(1, 2),
])
def test_roundtrip_plain_values(value):
    got, frames = _roundtrip(value)
    assert got == value and type(got) is type(value)
    assert len(frames) == 2  # small values stay in the pickle stream


@pytest.mark.parametrize("size", [wire.OOB_THRESHOLD, 3 * wire.OOB_THRESHOLD + 1, 5 << 20])
def test_big_bytes_travel_out_of_band(size):
    value = os.urandom(size)
    got, frames = _roundtrip(value)
    assert got == value and type(got) is bytes
    assert len(frames) == 3 and len(frames[1]) < 1024  # the body does not carry the bytes


def test_numpy_arrays_roundtrip():
    rng = np.random.default_rng(0)
    arrays = {
        "small": np.arange(10, dtype=np.int64),
        "big": rng.standard_normal(100_000).astype(np.float32),
        "2d": rng.integers(0, 255, size=(512, 300), dtype=np.uint8),
        "non_contiguous": rng.standard_normal((400, 400))[::2, ::3],
        "fortran": np.asfortranarray(rng.standard_normal((300, 200))),
        "bool": rng.integers(0, 2, size=200_000).astype(bool),
        "structured": np.zeros(10_000, dtype=[("a", "i4"), ("b", "f8")]),
        "empty": np.empty((0, 3)),
    }
    got, frames = _roundtrip(arrays)
    assert set(got) == set(arrays)
    for k, a in arrays.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape, k
        assert np.array_equal(got[k], a), k
    assert len(frames) > 2  # the big ones went out of band


@pytest.mark.parametrize("same_host", [False, True])
def test_torch_tensors_roundtrip(same_host):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "small": torch.arange(5),
        "f32": torch.randn(300_000, generator=g),
        "bf16": torch.randn(200, 700, generator=g).to(torch.bfloat16),
        "f16_grad": torch.randn(100_000, generator=g).half().requires_grad_(True),
        "int8": torch.randint(-128, 127, (300, 300), dtype=torch.int8, generator=g),
        "bool": torch.rand(100_000, generator=g) > 0.5,
        "complex": torch.randn(40_000, dtype=torch.complex64, generator=g),
        "non_contiguous": torch.randn(512, 512, generator=g).t()[::2],
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 4),
    }
    got, frames = _roundtrip(tensors, same_host=same_host)
    for k, t in tensors.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape, k
        assert got[k].requires_grad == t.requires_grad, k
        assert torch.equal(got[k].detach(), t.detach()), k
    got["f32"].add_(1)  # received tensors are writable
    if same_host:
        assert _busy_segment_fds() == 2  # the one big enough for shared memory, under got["f32"]
        del got
        assert _busy_segment_fds() == 0  # unused again: back in the pool


def test_nan_payloads_are_bit_exact():
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 16,), dtype=torch.int32)
    t = bits.view(torch.float32)  # includes NaNs with arbitrary payloads
    got, _ = _roundtrip(t)
    assert torch.equal(got.view(torch.int32), bits)


def _main_class():
    ns: dict = {}
    exec(
        "class MainThing:\n"
        "    def __init__(self, x):\n"
        "        self.x = x\n"
        "    def double(self):\n"
        "        return 2 * self.x\n",
        ns,
    )
    cls = ns["MainThing"]
    cls.__module__ = "__main__"
    return cls


def test_main_module_objects_go_by_value():
    cls = _main_class()
    obj = cls(21)

    def local_fn(y):
        return y + 1

    local_fn.__module__ = "__main__"
    body, _ = wire.dumps(obj)
    assert b"MainThing" in body and b"double" in body  # the class itself is in the stream
    got, _ = _roundtrip({"obj": obj, "fn": local_fn, "cls": cls})
    assert got["obj"].double() == 42
    assert got["fn"](1) == 2
    assert got["cls"](2).double() == 4


def test_fast_and_full_pickle_paths_agree():
    values = [{"a": 1}, list(range(100)), "x" * 100_000, np.arange(50_000), torch.arange(50_000)]
    for v in values:
        fast = wire.loads(*wire.dumps(v))
        full = wire.loads(*wire.dumps_full(v))
        if isinstance(v, np.ndarray):
            assert np.array_equal(fast, v) and np.array_equal(full, v)
        elif isinstance(v, torch.Tensor):
            assert torch.equal(fast, v) and torch.equal(full, v)
        else:
            assert fast == v == full


def test_nested_pickled_values_survive_forwarding():
    inner = m.Pickled.of(os.urandom(200_000))
    reply = m.Reply(3, 1, True, inner)
    msg = wire.decode(wire.encode(reply))
    again = wire.decode(wire.encode(msg))  # a received message can be sent on
    assert again.payload.load() == inner.load()


def test_calls_and_answers_travel_compact():
    """A call and an answer carrying a Pickled go as a tuple of plain values; any other answer as a
    pickle of the message; every form comes back equal, big bodies and buffers out of band."""
    small = _call(1)
    big = m.Call("a", "f", m.Pickled.of(("x" * 100_000, np.arange(20_000))), {}, {}, None, 0, "s")
    answers = [m.Reply(5, 2, True, m.Pickled.of([1, 2])), m.Reply(5, 0, False, m.Pickled.of(ValueError("no"))),
               m.Reply(6, 0, True, True), m.Reply(6, 1, False, RuntimeError("agent says no"))]
    broadcast = m.Call("a", "f", m.Pickled.of(((1,), {})), {"gpus": 0}, {"gpus": 2}, None, 0, "s")
    for msg in [small, big, broadcast, *answers]:
        frames = wire.encode(msg)
        compact = type(msg.payload) is m.Pickled
        # An answer, or a call that waits for one, without buffers: struct and the body (a call's
        # repeated part as a pickle its receiver decodes once), no pickle per message.
        raw = compact and not (msg.payload.buffers or len(msg.payload.body) >= wire.OOB_THRESHOLD) and (
            type(msg) is m.Reply or msg.reply is not None)
        assert frames[0].endswith(b"=" + type(msg).__name__.encode() + (b"/raw" if raw else b"")) == compact
        assert wire.message_type(frames) is type(msg)
        got = wire.decode([memoryview(bytes(f)) if not isinstance(f, bytes) else f for f in frames])
        assert type(got) is type(msg)
        if isinstance(msg.payload, m.Pickled):
            a, b = got.payload.load(), msg.payload.load()
            assert repr(a) == repr(b) and type(got.payload.body) in (bytes, memoryview)
        else:
            assert repr(got.payload) == repr(msg.payload)
        assert all(getattr(got, k) == getattr(msg, k) for k in msg.__dataclass_fields__ if k != "payload")
    assert len(wire.encode(big)) == 4  # the 100 kB body and the array: frames of their own, not in the tuple


def test_compact_bodies_name_no_class():
    """A peer that puts a class (or any global) into a compact body has its message dropped as
    malformed before anything is imported or called; so does one whose values do not fit."""
    header = wire.encode(m.Call("actor-1", "echo", m.Pickled.of(((1,), {})), {}, {}, None, 0, "s"))[0]
    assert header.endswith(b"=Call")
    evil = b"\x80\x05\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."  # os.system("true")
    for body in [evil, pickle.dumps((1, 2), protocol=5), pickle.dumps([1] * 10, protocol=5)]:
        with pytest.raises(wire.WireError):
            wire.decode([header, body])
    with pytest.raises(wire.WireError):  # the slow path (with buffers) refuses it the same way
        wire.decode([header[:6] + struct.pack("!I", 1) + b"\0" + header[10:], evil, b"x"])
    # A raw answer: too short, an ok that is neither 0 nor 1, or buffers beside it.
    raw = wire.encode(m.Reply(5, 0, True, m.Pickled.of(1)))
    assert raw[0].endswith(b"/raw")
    for frames in ([raw[0], raw[1][:10]], [raw[0], raw[1][:16] + b"\x07" + raw[1][17:]],
                   [raw[0][:6] + struct.pack("!I", 1) + b"\0" + raw[0][10:], raw[1], b"x"]):
        with pytest.raises(wire.WireError):
            wire.decode(frames)


def test_raw_calls_name_no_class_and_share_nothing():
    """A raw call's repeated part is read by the unpickler that refuses every global, its values are
    checked, what is cached of it stays bounded, and each call gets dicts of its own."""
    good = wire.encode(_call(1))
    assert good[0].endswith(b"=Call/raw")
    head = good[0]
    n = struct.unpack_from("!I", good[1])[0]
    rest = good[1][4 + n:]
    evil = b"\x80\x05\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."  # os.system("true")
    bad_prefixes = [evil, pickle.dumps((1, 2), protocol=5), pickle.dumps(("a", "f", [], {}, "r", "s"), protocol=5),
                    pickle.dumps(("a", "f", {}, {}, None, "s"), protocol=5), b"\x80\x04K\x01.",
                    b"\x80\x05Nr" + (1 << 30).to_bytes(4, "little") + b"."]  # a memo index of 1 GiB: checked first
    for prefix in bad_prefixes:
        with pytest.raises(wire.WireError):
            wire.decode([head, struct.pack("!I", len(prefix)) + prefix + rest])
    for body in [good[1][:3], good[1][:4 + n - 1], good[1][:4 + n + 5], struct.pack("!I", 1 << 30) + good[1][4:]]:
        with pytest.raises(wire.WireError):
            wire.decode([head, body])
    a, b = wire.decode(good), wire.decode(good)
    assert a.point == b.point == {"gpus": 1} and a.point is not b.point and a.extent is not b.extent
    a.point["gpus"] = 3  # what one call's receiver does to its dicts is not the next one's
    assert wire.decode(good).point == {"gpus": 1}
    for i in range(m._CALL_CACHE_MAX + 10):  # many distinct callers: the cache is bounded
        wire.decode(wire.encode(m.Call(f"actor-{i}", "f", m.Pickled.of(((i,), {})), {}, {},
                                       m.PortRef("tcp://127.0.0.1:5555", i + 1), 0, "s")))
    assert len(m._call_statics) <= m._CALL_CACHE_MAX and len(m._call_prefixes) <= m._CALL_CACHE_MAX


def test_segment_path_takes_over_descriptors():
    value = os.urandom(2 << 20)
    before = _busy_segment_fds()
    fds: list[int] = []
    frames = wire.encode(_call(value), fds=fds)
    assert len(fds) == 1 and len(frames[2]) < 100  # the frame is only the segment's length
    got = wire.decode(frames, fds).payload.load()[0][0]
    assert got == value and type(got) is bytes
    assert _busy_segment_fds() == before  # read, and handed back to the pool
    # A message whose descriptors do not match its header is refused, and they are closed.
    fds = []
    frames = wire.encode(_call(value), fds=fds)
    with pytest.raises(wire.WireError):
        wire.decode(frames, fds + [os.dup(fds[0])])
    with pytest.raises(wire.WireError):
        wire.decode(frames[:2] + [struct.pack("!Q", 1)], fds)  # a length that is not the segment's
    assert _busy_segment_fds() == before


def test_recycled_segments_never_show_old_bytes():
    first = os.urandom(3 << 20)
    second = os.urandom(2 << 20)  # smaller: reuses the first one's segment, cut down to size
    for value in (first, second, first):
        got, _ = _roundtrip(value, same_host=True)
        assert got == value


# -- malformed input ------------------------------------------------------------------------


def _valid_frames() -> list:
    return wire.encode(_call(os.urandom(100_000)))


@pytest.mark.parametrize("frames", [
    [],
    [b""],
    [b"MNR"],
    [b"XXXX" + b"\0" * 6, b""],
    [struct.pack("!4sHI", b"MNRC", 99, 0), pickle.dumps(1)],
    [struct.pack("!4sHI", b"MNRC", 1, 1), pickle.dumps(1)],  # says 1 buffer, has no kind byte
    [struct.pack("!4sHI", b"MNRC", 1, 1) + b"\0", pickle.dumps(1)],  # a buffer is missing
    [struct.pack("!4sHI", b"MNRC", 1, 0), pickle.dumps(1), b"extra"],
    [struct.pack("!4sHI", b"MNRC", 1, 1) + b"\x07", pickle.dumps(1), b"x"],  # unknown buffer kind
    [struct.pack("!4sHI", b"MNRC", 1, 1) + b"\x01", pickle.dumps(1), b"../../etc/passwd"],  # no descriptor
    [struct.pack("!4sHI", b"MNRC", 1, 1) + b"\x01", pickle.dumps(1), struct.pack("!Q", 8)],
    [struct.pack("!4sHI", b"MNRC", 1, 0), b""],
    [struct.pack("!4sHI", b"MNRC", 1, 0), b"garbage that is not a pickle"],
    [struct.pack("!4sHI", b"MNRC", 1, 0), pickle.dumps(1)[:-1]],
    [struct.pack("!4sHI", b"MNRC", 1, 0), b"\x80\x05cnosuchmodule\nthing\n."],
    [struct.pack("!4sHI", b"MNRC", 1, 0), b"\x80\x05\x97."],  # out-of-band buffer that was not sent
    [struct.pack("!4sHI", b"MNRC", 1, 0), pickle.dumps(1, protocol=4)],  # not what we write
    [struct.pack("!4sHI", b"MNRC", 1, 0), b"\x80"],
    [struct.pack("!4sHI", b"MNRC", 1, 0xFFFFFFFF), b""],
    [None, None],
])
def test_malformed_frames_raise_wire_error(frames):
    with pytest.raises(wire.WireError):
        wire.decode(frames)


def test_truncated_and_corrupted_messages_raise_only_wire_error():
    rng = random.Random(1234)
    good = [bytes(f) for f in _valid_frames()]
    assert wire.decode(good).method == "echo"
    errors = 0
    cases = []
    for cut in range(len(good[1])):  # every truncation of the body
        cases.append([good[0], good[1][:cut], good[2]])
    for cut in range(0, len(good[0])):  # and of the header
        cases.append([good[0][:cut], good[1], good[2]])
    cases.append(good[:2])  # a buffer missing
    cases.append(good + [b"x"])  # one too many
    # Random bytes behind a valid header, and bodies whose protocol mark is corrupted.  (Not
    # random pickle opcodes: the C unpickler trusts a memo index, and a random one can make it
    # allocate gigabytes.  Peers are authenticated, and CURVE rules out corruption in transit.)
    for _ in range(2000):
        if rng.random() < 0.5:
            body = rng.randbytes(rng.randrange(0, 64))
            cases.append([struct.pack("!4sHI", b"MNRC", 1, 0), body])
        else:
            body = bytearray(good[1])
            body[rng.randrange(2)] ^= rng.randrange(1, 256)
            cases.append([good[0], bytes(body), good[2]])
    for frames in cases:
        try:
            wire.decode(frames)
        except wire.WireError:
            errors += 1
        # anything else propagates and fails the test
    assert errors >= len(good[1]) + len(good[0])


# -- through a real actor ----------------------------------------------------------------------


class Echo(Actor):
    @endpoint
    def echo(self, value):
        return value

    @endpoint
    def set_shm_threshold(self, n: int) -> int:
        old = wire.SHM_THRESHOLD
        wire.SHM_THRESHOLD = n
        return old

    @endpoint
    def checksum(self, t) -> int:
        return int(t.view(torch.uint8).to(torch.int64).sum())


@pytest.fixture(scope="module")
def echo():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    yield procs.spawn("echo", Echo)
    procs.stop().get(timeout=T)


def _big_tensor() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    bits = torch.randint(-(2**31), 2**31 - 1, (16 << 20,), dtype=torch.int32, generator=g)
    return bits.view(torch.float32)  # 64 MiB, NaN payloads included


def _count_segment_writes(monkeypatch) -> list:
    writes: list[int] = []
    real = shm.write
    monkeypatch.setattr(shm, "write", lambda raw: writes.append(raw.nbytes) or real(raw))
    return writes


def test_64mib_tensor_echo_through_frames(echo, monkeypatch):
    t = _big_tensor()
    assert t.nbytes == 64 << 20
    shm_writes = _count_segment_writes(monkeypatch)
    monkeypatch.setattr(wire, "SHM_THRESHOLD", 1 << 62)  # this side: send as frames
    old = echo.set_shm_threshold.call_one(1 << 62).get(timeout=T)  # and the actor's side too
    try:
        back = echo.echo.call_one(t).get(timeout=T)
    finally:
        echo.set_shm_threshold.call_one(old).get(timeout=T)
    assert shm_writes == []
    assert back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(back.view(torch.int32), t.view(torch.int32))


def test_64mib_tensor_echo_through_shared_memory(echo, monkeypatch):
    t = _big_tensor()
    shm_writes = _count_segment_writes(monkeypatch)
    before = _busy_segment_fds()
    back = echo.echo.call_one(t).get(timeout=T)
    assert shm_writes == [64 << 20]  # it went through shared memory
    assert _busy_segment_fds() == before + 2  # ``back`` lives on the segment it came in
    assert torch.equal(back.view(torch.int32), t.view(torch.int32))
    assert echo.checksum.call_one(t).get(timeout=T) == int(t.view(torch.uint8).to(torch.int64).sum())
    del back
    assert _busy_segment_fds() == before  # none held once unused (idle ones wait in the pool)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("monarch")]  # and nothing is named


def test_big_bytes_and_arrays_echo(echo):
    blob = os.urandom(3 << 20)
    arr = np.random.default_rng(1).standard_normal((1000, 300))
    got = echo.echo.call_one({"blob": blob, "arr": arr, "small": b"x"}).get(timeout=T)
    assert got["blob"] == blob and got["small"] == b"x"
    assert np.array_equal(got["arr"], arr)


# -- a live agent fed garbage ------------------------------------------------------------------


def test_agent_survives_10000_malformed_messages(client, tmp_path):
    rt = client
    agent = start_host_agent(rt.keys, tmp_path, hostname="fuzzed")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.curve_serverkey = rt.keys.host_server[0].encode()  # a host agent listens with its own keys
        sock.curve_publickey = rt.keys.client_public.encode()
        sock.curve_secretkey = rt.keys.client_secret.encode()
        sock.sndhwm = 0
        sock.connect(transport.zmq_endpoint(agent.addr))
        rng = random.Random(99)
        good = [bytes(f) for f in _valid_frames()]
        ping_port = m.PortRef("tcp://127.0.0.1:1", 1)  # a Ping whose answer goes nowhere
        ping = [bytes(f) for f in wire.encode(m.Ping(ping_port))]
        header = struct.pack("!4sHI", b"MNRC", 1, 0)
        at = ping[1].index(b"tcp://")
        sent = 0
        for i in range(10_000):
            kind = i % 6
            if kind == 0:  # random frames
                frames = [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 5))]
            elif kind == 1:  # a valid header, random body
                frames = [header, rng.randbytes(rng.randrange(0, 100))]
            elif kind == 2:  # truncated body
                frames = [good[0], good[1][: rng.randrange(len(good[1]))], good[2]]
            elif kind == 3:  # truncated ping
                frames = [ping[0], ping[1][: rng.randrange(len(ping[1]))]]
            elif kind == 4:  # a ping that decodes, answering to a malformed address
                body = bytearray(ping[1])
                body[at + rng.randrange(6)] = rng.getrandbits(8)  # somewhere in "tcp://"
                frames = [ping[0], bytes(body)]
            else:  # lying headers: wrong counts, shared-memory names that do not exist
                n = rng.randrange(0, 4)
                kinds = bytes(rng.choice([0, 1, 5]) for _ in range(n))
                frames = [struct.pack("!4sHI", b"MNRC", 1, n) + kinds, good[1],
                          *[b"monarch-" + rng.randbytes(8).hex().encode() for _ in range(n)]]
            sock.send_multipart([f if f else b"" for f in frames])
            sent += 1
        assert sent == 10_000
        # Same connection, so it is handled after all of the above: the agent still answers.
        fut: Future = Future()
        port = rt.open_port(OneShot(rt, fut), (agent.addr,))
        sock.send_multipart(wire.encode(m.Ping(port)))
        info = fut.get(timeout=T)
        assert isinstance(info, m.HostInfo) and info.pid == agent.pid
        assert agent.proc.poll() is None
        # And it still does real work.
        hm = agent.host_mesh()
        procs = hm.spawn_procs(per_host={"gpus": 1})
        assert procs.spawn("e", Echo).echo.call_one("alive").get(timeout=T) == "alive"
        procs.stop().get(timeout=T)
    finally:
        sock.close(0)
        ctx.term()
        agent.stop()


def test_message_bytes_counts_frames_and_shared_memory_segments():
    """What codec_max_frame_length measures: every frame, and a shared-memory segment by its size."""
    big = bytearray(3 << 20)
    fds: list[int] = []
    frames = wire.encode({"x": pickle.PickleBuffer(big)}, fds=fds)
    try:
        assert fds, "a buffer of 3 MiB to a same-host peer goes through shared memory"
        assert wire.message_bytes(frames) == sum(len(memoryview(f).cast("B")) for f in frames[:2]) + len(big)
    finally:
        for fd in fds:
            os.close(fd)
    inline = wire.encode({"x": pickle.PickleBuffer(big)})
    assert wire.message_bytes(inline) == sum(memoryview(f).nbytes for f in inline)
    assert wire.message_bytes(wire.encode(12)) == sum(len(f) for f in wire.encode(12))
