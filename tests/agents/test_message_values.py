"""Every message that crosses the wire carries plain values, on every Python we support.

An enum or any other object of the standard library pickles differently from one Python to the
next: Debian 12's /usr/bin/python3 (3.11.2) pickles ``signal.SIGTERM`` as the global
``signal.SIGTERM``, which the envelope decoder refuses, so every signal to a run was dropped there
while 3.11.7 worked.  So each message type is built here and sent through the real encoder and
envelope decoder, and its pickle may name no global but our own message types and builtins.
CI runs this file on Debian's Python too (scripts/test.sh).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import signal
import struct
import sys

import pytest

from monarch_agents import messages as m
from monarch_agents import wire
from monarch_rdmafs import messages as ws

pytestmark = pytest.mark.timeout(60)

_PORT = m.PortRef("tcp://127.0.0.1:5555", 7)

#: A plain sample value for each field annotation the message modules use.
_SAMPLES = {
    "str": "x", "int": 3, "float": 1.5, "bool": True, "bytes": b"data",
    "list": [1, "a"], "dict": {"k": 1}, "tuple": (1, "a"), "Any": "any",
    "PortRef": _PORT, "PortRef | None": _PORT, "m.PortRef | None": _PORT,
    "str | None": "x", "int | None": 2, "float | None": 2.5, "list | None": [1],
}

#: What an ``Any`` field holds in practice, by the field's name.
_ANY_BY_NAME = {"payload": b"chunk bytes", "reply": _PORT}


def _message_types() -> list[type]:
    found = []
    for mod in (m, ws):
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__ and dataclasses.is_dataclass(cls):
                found.append(cls)
    return found


def _build(cls: type):
    if cls is m.Pickled:
        return m.Pickled.of(("a", 1))
    args = []
    for f in dataclasses.fields(cls):
        if f.type == "Pickled":
            args.append(m.Pickled.of(("a", 1)))
        elif f.type == "Any" and f.name in _ANY_BY_NAME:
            args.append(_ANY_BY_NAME[f.name])
        elif f.type in _SAMPLES:
            args.append(_SAMPLES[f.type])
        else:
            raise AssertionError(f"{cls.__name__}.{f.name}: no sample for annotation {f.type!r}; add one")
    return cls(*args)


def _globals_named(body: bytes) -> set[tuple[str, str]]:
    """Every (module, name) the envelope decoder is asked for while it decodes ``body``."""
    named: set[tuple[str, str]] = set()

    class Recording(wire._EnvelopeUnpickler):
        def find_class(self, module: str, name: str):
            named.add((module, name))
            return super().find_class(module, name)

    Recording(io.BytesIO(body)).load()
    return named


def _allowed(module: str, name: str) -> bool:
    return module.startswith(("monarch_agents.", "monarch_rdmafs.", "monarch_telemetry.")) or (
        module == "builtins" and name in ("set", "frozenset", "bytearray"))


@pytest.mark.parametrize("cls", _message_types(), ids=lambda c: f"{c.__module__.split('.')[0]}.{c.__name__}")
def test_every_message_round_trips_with_plain_values(cls):
    msg = _build(cls)
    frames = wire.encode(msg)
    body = bytes(frames[1])
    assert len(frames) == 2  # no out-of-band buffer: the samples are small
    if frames[0].endswith(b"=Call/raw"):  # a raw call: its repeated part is the pickle in it
        (n,) = struct.unpack_from("!I", body)
        body = body[4:4 + n]
    strange = {g for g in _globals_named(body) if not _allowed(*g)}
    assert not strange, f"{cls.__name__} pickles globals {strange} (only plain values may cross the wire)"
    got = wire.decode([bytes(f) for f in frames])
    assert type(got) is cls
    if cls is m.Pickled:
        assert got.load() == msg.load()
        return
    for f in dataclasses.fields(cls):
        a, b = getattr(got, f.name), getattr(msg, f.name)
        if isinstance(b, m.Pickled):
            assert a.load() == b.load()
        else:
            assert a == b, f"{cls.__name__}.{f.name}: {a!r} != {b!r}"


def test_the_list_of_message_types_is_not_empty():
    names = {c.__name__ for c in _message_types()}
    assert {"SignalRun", "KillProc", "RunCommand", "RunExited", "WsChunks", "DebugOutput"} <= names


@pytest.mark.parametrize("make", [lambda s: m.SignalRun("run-1", s), lambda s: m.KillProc(123, s, _PORT)],
                         ids=["SignalRun", "KillProc"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_a_signal_travels_as_an_int(make, sig):
    """What every caller passes (``signal.SIGTERM``, an enum) arrives as the plain int, whatever the Python."""
    frames = wire.encode(make(sig))
    assert not {g for g in _globals_named(bytes(frames[1])) if not _allowed(*g)}, sys.version
    got = wire.decode([bytes(f) for f in frames])
    assert type(got.signum) is int and got.signum == int(sig)
