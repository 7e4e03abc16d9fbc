"""Framing: one message <-> a list of frames.

A message on the wire is::

    [header, body, buf_0, buf_1, ...]

``header`` is a fixed struct (magic, version, number of buffers) followed by one
kind byte per buffer: ``0`` the buffer travels as its own frame, ``1`` the
frame holds only its length and the buffer is a shared-memory segment whose
descriptor travels beside the frames (same-host peers, see ``monarch_agents/ipc.py``
and ``monarch_agents/shm.py``); then the message's type as ``module:name``, so a receiver
decides whether it takes that type from that sender before it decodes the body
(:func:`message_type`), and checks the body is that type after.  ``body`` is pickle protocol 5; large buffers (NumPy
arrays, tensors, big ``bytes``) are taken out of band so they are never copied
into the pickle stream.

This is the only module that calls ``pickle``.  It is only ever handed frames
from an authenticated peer (see ``monarch_agents/transport.py`` and ``monarch_agents/ipc.py``);
anything that does not decode raises :class:`WireError`, which the receive
loop logs and drops.

What this module does not do: compression, or encryption (CURVE does that).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import sys
from typing import Any, Callable, Sequence

import cloudpickle

from monarch_agents import shm

MAGIC = b"MNRC"
VERSION = 3  # 3: compact calls and answers (register_compact)
_HEADER = struct.Struct("!4sHI")  # magic, version, number of out-of-band buffers

#: Buffers at least this large leave the pickle stream as their own frame.
OOB_THRESHOLD = 64 * 1024
#: Buffers at least this large go through shared memory when the peer shares our host.
SHM_THRESHOLD = 1 << 20
#: At most this many buffers of one message go through shared memory (the rest as frames).
MAX_SEGMENTS = 32
#: The longest frame (or shared-memory segment) a receiver accepts; a peer announcing more is cut
#: off before anything is allocated for it.  ``MONARCH_MAX_FRAME_BYTES`` raises it for bigger tensors.
MAX_FRAME_BYTES = int(os.environ.get("MONARCH_MAX_FRAME_BYTES", 8 << 30))
#: The longest message a proc's key (user code) may send to a host agent (``MONARCH_PROC_MAX_FRAME_BYTES``):
#: what actors ask of their host agent is small (a controller still takes big results from its procs).
PROC_MAX_FRAME_BYTES = int(os.environ.get("MONARCH_PROC_MAX_FRAME_BYTES", 256 << 20))

_PROTO_5 = b"\x80\x05"  # how a pickle protocol 5 stream begins
_KIND_FRAME = 0
_KIND_SEGMENT = 1
_SEGMENT = struct.Struct("!Q")  # a segment's frame: its length


class WireError(Exception):
    """A frame list that is not a well-formed monarch message."""


def _rebuild_bytes(buf: Any) -> bytes:
    return shm.to_bytes(buf)


def _rebuild_bytearray(buf: Any) -> bytearray:
    return bytearray(buf)


class _Buffer:
    """A big ``bytes``, ``bytearray`` or ``memoryview`` on its way out of band.

    The C pickler writes ``bytes`` and ``bytearray`` into the stream itself and
    never asks a reducer about them, so they are wrapped before pickling (a
    ``memoryview`` arrives as ``bytes``, the one type it can become).
    """

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __reduce__(self) -> Any:
        rebuild = _rebuild_bytearray if type(self.obj) is bytearray else _rebuild_bytes
        return rebuild, (pickle.PickleBuffer(self.obj),)


#: How many containers, and how deep, :func:`_wrap_buffers` looks into for big bytes.
_WALK_ITEMS = 256
_WALK_DEPTH = 4


def _wrap_buffers(obj: Any) -> Any:
    """``obj`` with its big bytes-like values wrapped in :class:`_Buffer`.

    Looks into tuples, lists and dicts (endpoint arguments and results are
    mostly those), within a small budget so that a call with small arguments
    pays next to nothing.  Bytes deeper down, or inside other objects, still
    arrive intact, copied through the pickle stream.  A container that held a
    big buffer is rebuilt, so two references to it become two copies.
    """
    return _rebuild(obj, _WALK_DEPTH) if _has_big(obj) else obj


def _has_big(obj: Any) -> bool:
    if type(obj) in _ATOMS:  # a result is often one number or string: no walk
        return False
    return _big_in(obj, _WALK_DEPTH, [_WALK_ITEMS])


#: Types that are never a big buffer nor hold one: skipped without a call (every call's arguments are walked).
_ATOMS = frozenset({int, float, str, bool, type(None)})


def _big_in(o: Any, depth: int, budget: list[int]) -> bool:
    t = type(o)
    if t is tuple or t is list or t is dict:
        if not depth:
            return False
        budget[0] -= len(o)
        if budget[0] < 0:
            return False
        for x in (o.values() if t is dict else o):
            tx = type(x)
            if tx in _ATOMS:
                continue
            if tx is tuple or tx is list:
                # No call for what holds nothing, or a few atoms (an endpoint's positional arguments).
                if len(x) <= 8:
                    for y in x:
                        if type(y) not in _ATOMS:
                            break
                    else:
                        continue
            elif tx is dict and not x:
                continue
            if _big_in(x, depth - 1, budget):
                return True
        return False
    if t is bytes or t is bytearray:
        return len(o) >= OOB_THRESHOLD
    if t is memoryview:
        return o.nbytes >= OOB_THRESHOLD
    if t.__module__ == "torch":  # a tensor: big ones go out of band (see dumps)
        try:
            return o.nbytes >= OOB_THRESHOLD
        except Exception:
            return False
    return False


def _rebuild(o: Any, depth: int) -> Any:
    t = type(o)
    if t is bytes or t is bytearray:
        return _Buffer(o) if len(o) >= OOB_THRESHOLD else o
    if t is memoryview:
        return _Buffer(o) if o.nbytes >= OOB_THRESHOLD and o.c_contiguous else o
    if (t is not tuple and t is not list and t is not dict) or not depth or len(o) > _WALK_ITEMS:
        return o
    if t is dict:
        return {k: _rebuild(v, depth - 1) for k, v in o.items()}
    return t([_rebuild(x, depth - 1) for x in o])


def _rebuild_tensor(buf: Any, dtype_name: str, shape: tuple, requires_grad: bool) -> Any:
    import torch

    dtype = getattr(torch, dtype_name)
    mv = memoryview(buf)
    if mv.readonly:
        # Frames from ZeroMQ are read-only; torch wants writable memory.
        mv = memoryview(bytearray(mv))
    if mv.nbytes == 0:
        t = torch.empty(shape, dtype=dtype)
    else:
        t = torch.frombuffer(mv, dtype=torch.uint8).view(dtype).reshape(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


#: Set by monarch (``monarch._src.actor.source_loader``): ``source_loader(filename)`` is a picklable object
#: whose ``get_source(module_name)`` gives ``filename``'s text as the client has it.  It goes in the
#: globals of each function pickled by value as ``__loader__``, so that where that file is missing
#: (a notebook cell, code made with ``exec``) pdb and tracebacks there still show its lines: linecache
#: asks a module's ``__loader__`` for what it cannot read.
source_loader: Callable[[str], Any] | None = None


class _Pickler(cloudpickle.Pickler):
    """Pickle 5 with out-of-band buffers for big bytes and CPU tensors.

    cloudpickle pickles by value only what cannot be imported (classes and
    functions from ``__main__``); everything importable goes by reference.
    """

    def _dynamic_function_reduce(self, func: Any) -> Any:
        reduced = super()._dynamic_function_reduce(func)
        make = source_loader
        if make is not None:
            slotstate = reduced[2][1]
            names = slotstate.get("__globals__")
            if isinstance(names, dict) and "__loader__" not in names:
                slotstate["__globals__"] = {**names, "__loader__": make(func.__code__.co_filename)}
        return reduced

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if t.__module__ == "torch" and t.__name__ in ("Tensor", "Parameter"):
            reduced = _reduce_tensor(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


def _reduce_tensor(t: Any) -> Any:
    if t.device.type != "cpu" or t.is_sparse or t.is_quantized or t.nbytes < OOB_THRESHOLD:
        return None
    if type(t).__name__ == "Parameter":
        return None
    c = t.detach().contiguous()
    flat = c.view(-1).view(__import__("torch").uint8) if c.numel() else c
    dtype_name = str(c.dtype).removeprefix("torch.")
    return _rebuild_tensor, (pickle.PickleBuffer(flat.numpy()), dtype_name, tuple(c.shape), t.requires_grad)


# The C pickler is ~10x faster than a Python-level reducer_override; it is
# right unless the stream names ``__main__`` (must go by value), holds torch
# tensors (we send their memory out of band) or big in-band bytes.
_REDO_MARKER = b"__main__"


_dispatch: dict | None = None


def _tensor_dispatch() -> dict | None:
    """copyreg's table plus torch.Tensor, built once torch is imported (None before).

    The C pickler consults dispatch_table per type without calling into
    Python for every object, so tensors go out of band at C speed.
    """
    global _dispatch
    if _dispatch is None and "torch" in sys.modules:
        import copyreg

        def reduce(t: Any) -> Any:
            return _reduce_tensor(t) or t.__reduce_ex__(5)
        _dispatch = {**copyreg.dispatch_table, sys.modules["torch"].Tensor: reduce}
    return _dispatch


def dumps(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle a user value; returns the body and its out-of-band buffers."""
    buffers: list[pickle.PickleBuffer] = []
    # _has_big and _dumps5 written out here: a Python call is ~1k instructions, and every call
    # and answer comes through.
    if type(obj) not in _ATOMS and _big_in(obj, _WALK_DEPTH, [_WALK_ITEMS]):
        # Big bytes or a big tensor within reach: out of band.
        obj = _rebuild(obj, _WALK_DEPTH)
        body = _dumps_c(obj, buffers)
    else:
        # Most calls: one C call.  With torch imported, the Pickler with the tensor table (an
        # object, a BytesIO and a table per call) costs twice the pickling of small arguments,
        # so it is used only when the stream shows a tensor (deeper down than the walk looks).
        try:
            body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
            if buffers and _any_small(buffers):  # (rare) small ones stay in band: again, keeping them
                buffers = []
                body = pickle.dumps(obj, protocol=5, buffer_callback=_keep_into(buffers))
        except Exception:
            body = None
        # find(), not ``in``: bytes.__contains__ first tries its argument as an int, and the
        # TypeError it makes and drops (a formatted message) cost more than the pickling (~4k
        # instructions a call, twice per value).
        if body is not None and body.find(_TORCH_MARKER) >= 0 and _tensor_dispatch() is not None:
            buffers = []
            body = _dumps_c(obj, buffers)
    if body is not None and body.find(_REDO_MARKER) < 0:
        return body, buffers
    return dumps_full(obj)


def _dumps5(obj: Any, buffers: list) -> bytes:
    """``pickle.dumps(obj, protocol 5)`` with big buffers out of band into ``buffers``: one C call,
    with no callback made per call (``list.append`` answers None: out of band); a value that had
    a small buffer (rare) is pickled again, keeping those in band."""
    body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    if buffers and _any_small(buffers):
        buffers.clear()
        return pickle.dumps(obj, protocol=5, buffer_callback=_keep_into(buffers))
    return body


def _any_small(buffers: list) -> bool:
    for b in buffers:
        if b.raw().nbytes < OOB_THRESHOLD:
            return True
    return False


#: What a pickle stream that holds a torch object names (its module).
_TORCH_MARKER = b"torch"


def _dumps_c(obj: Any, buffers: list) -> bytes | None:
    """``obj`` by the C pickler (None if it cannot: cloudpickle then does)."""
    try:
        table = _tensor_dispatch()
        if table is None:  # one C call: a Pickler object and a BytesIO cost more than the pickling itself
            return _dumps5(obj, buffers)
        f = io.BytesIO()
        p = pickle.Pickler(f, protocol=5, buffer_callback=_keep_into(buffers))
        p.dispatch_table = table
        p.dump(obj)
        return f.getvalue()
    except Exception:
        return None


def _keep_into(buffers: list) -> Any:
    def keep(b: pickle.PickleBuffer) -> bool:
        # Small buffers stay in-band: a frame of their own costs more than the copy.
        if b.raw().nbytes >= OOB_THRESHOLD:
            buffers.append(b)
            return False
        return True
    return keep


def dumps_full(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle with cloudpickle for ``__main__`` and zero-copy tensors and bytes."""
    obj = _wrap_buffers(obj)
    buffers: list[pickle.PickleBuffer] = []

    def keep(b: pickle.PickleBuffer) -> bool:
        # Small buffers stay in-band: a frame of their own costs more than the copy.
        if b.raw().nbytes >= OOB_THRESHOLD:
            buffers.append(b)
            return False
        return True

    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=keep).dump(obj)
    return f.getvalue(), buffers


def loads(body: Any, buffers: Sequence[Any]) -> Any:
    """Inverse of :func:`dumps`: a user value, which may name any importable class."""
    return pickle.loads(body, buffers=buffers)


# --- the envelope unpickler ---------------------------------------------------------------

#: Packages whose message classes (and the error types answers carry) an envelope may name.
_OUR_PACKAGES = ("monarch_agents.", "monarch_rdmafs.", "monarch_telemetry.")
#: Other names an envelope may load: functions of ours that only rebuild their own class, and
#: value types of the standard library that messages carry (a signal number arrives as ``Signals``).
ENVELOPE_GLOBALS = {
    ("monarch_agents.errors", "_make_actor_error"),
    ("monarch_agents.errors", "_make_supervision_error"),
    ("signal", "Signals"),
    # Telemetry rows are columns of array.array (rebuilt from a type code and bytes; no code runs).
    ("array", "array"),
    ("array", "_array_reconstructor"),
}
#: Builtins an envelope may name besides exception classes (protocol 5 writes most containers as opcodes).
#: None allocates more than its arguments: ``bytearray(n)`` or ``range(n)`` (fed to a set or an
#: array) would turn a few bytes into gigabytes, so they are not here (protocol 5 never names them).
_SAFE_BUILTINS = {"set", "frozenset", "complex", "slice"}


class EnvelopeError(pickle.UnpicklingError):
    """An envelope named something that is not a message type: it is never imported or called."""


def _envelope_global(module: str, name: str) -> Any:
    """What an envelope may load under ``module.name``: our message and error types, and no code."""
    import importlib

    if (module, name) in ENVELOPE_GLOBALS:
        return getattr(importlib.import_module(module), name)
    if module == "builtins":
        obj = getattr(__import__("builtins"), name, None)
        if isinstance(obj, type) and (issubclass(obj, BaseException) or name in _SAFE_BUILTINS):
            return obj
    elif module.startswith(_OUR_PACKAGES) and "." not in name:
        obj = getattr(importlib.import_module(module), name, None)
        if isinstance(obj, type) and _is_record_type(obj):
            return obj
    elif module in sys.modules and "." not in name:
        # A message type of a service plugged in from elsewhere: its module is already imported
        # (the receiver registered a handler for it); a peer never makes us import one.
        obj = getattr(sys.modules[module], name, None)
        if isinstance(obj, type) and _is_message_type(obj):
            return obj
    raise EnvelopeError(f"an envelope may not name {module}.{name} (user values travel as Pickled)")


def _is_message_type(cls: type) -> bool:
    from monarch_agents.messages import Message

    return issubclass(cls, Message)


def _is_record_type(cls: type) -> bool:
    import dataclasses
    import enum

    return dataclasses.is_dataclass(cls) or issubclass(cls, (BaseException, enum.Enum))


_envelope_globals: dict[tuple[str, str], Any] = {}


# What each opcode of a pickle takes after it: (how, size).  how 0: ``size`` fixed bytes; 1: a
# ``size``-byte little-endian length, then that many bytes; 2: ``size`` newline-ended lines.
# Opcodes not listed are refused: PUT, BINPUT and LONG_BINPUT (the C unpickler grows its memo to the
# index they name: 12 bytes can make it allocate 16 GiB; protocol 5 writes MEMOIZE instead), the
# persistent ids and the extension registry (never used by us).
_OPCODE_ARGS: dict[int, tuple[int, int]] = {
    **{ord(c): (0, 0) for c in "(.012N)]}aeltdsubRo"},
    **{op: (0, 0) for op in (0x81, 0x92, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8F, 0x90, 0x91, 0x93, 0x94, 0x97, 0x98)},
    ord("K"): (0, 1), ord("M"): (0, 2), ord("J"): (0, 4), ord("G"): (0, 8), ord("h"): (0, 1), ord("j"): (0, 4),
    0x80: (0, 1), 0x95: (0, 8),
    ord("U"): (1, 1), ord("T"): (1, 4), ord("C"): (1, 1), ord("B"): (1, 4), 0x8E: (1, 8), ord("X"): (1, 4),
    0x8C: (1, 1), 0x8D: (1, 8), 0x96: (1, 8), 0x8A: (1, 1), 0x8B: (1, 4),
    **{ord(c): (2, 1) for c in "ILFSVg"}, ord("c"): (2, 2), ord("i"): (2, 2),
}
_ARGS_TABLE = [_OPCODE_ARGS.get(i) for i in range(256)]


def check_pickle(body: Any) -> None:
    """Raise :class:`WireError` unless ``body`` is a pickle whose every opcode and length fits in it.

    Run before the C unpickler sees a body from a peer that holds only a proc's key: no length,
    frame or memo index it names may make the receiver allocate more than the body's own size.
    """
    data = bytes(body)
    n = len(data)
    pos = 0
    table = _ARGS_TABLE
    while pos < n:
        op = data[pos]
        spec = table[op]
        if spec is None:
            raise WireError(f"opcode {op:#x} at {pos} is not one monarch writes")
        pos += 1
        how, size = spec
        if how == 0:
            if op == 0x95 and pos + 8 <= n and int.from_bytes(data[pos:pos + 8], "little") > n - pos - 8:
                raise WireError("a pickle frame longer than the body")
            pos += size
        elif how == 1:
            length = int.from_bytes(data[pos:pos + size], "little")
            pos += size + length
        else:
            for _ in range(size):
                end = data.find(b"\n", pos)
                if end < 0:
                    raise WireError("a text opcode without its line")
                pos = end + 1
        if pos > n:
            raise WireError("a pickle naming more bytes than it has")
        if op == 0x2E:  # STOP
            return
    raise WireError("a pickle without its end")


class _EnvelopeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        obj = _envelope_globals.get(key)
        if obj is None:
            obj = _envelope_globals[key] = _envelope_global(module, name)
        return obj


def loads_envelope(body: Any, buffers: Sequence[Any]) -> Any:
    """Unpickle a message: only monarch's own message and error types may be named.

    A user value inside travels as :class:`~monarch_agents.messages.Pickled` and
    is unpickled by :func:`loads` only by the code that uses it; so a peer cannot
    make a receive loop import a module or call a function of its choosing.
    """
    return _EnvelopeUnpickler(io.BytesIO(body), buffers=buffers).load()


def encode(obj: Any, *, fds: list[int] | None = None) -> list[Any]:
    """Frames for a monarch message.

    With ``fds`` (a peer on this host), large buffers go into shared-memory
    segments whose descriptors are appended to it; the caller sends them with
    the frames, or closes them.  Messages are our own dataclasses, so the plain
    C pickler does; user values inside them are already
    :class:`~monarch_agents.messages.Pickled`.  A type with a compact form
    (:func:`register_compact`) goes as a tuple of plain values instead.
    """
    raw = _raw_out.get(type(obj))
    if raw is not None:
        data = raw[1](obj)
        if data is not None:
            return [raw[0], data]
    buffers: list[pickle.PickleBuffer] = []
    compact = _compact_out.get(type(obj))
    if compact is not None:
        values = compact[1](obj)
        if values is not None:
            body = _dumps5(values, buffers)
            return encode_parts(body, buffers, fds, compact[0])
    body = _dumps5(obj, buffers)
    return encode_parts(body, buffers, fds, _type_name(type(obj)))


#: The compact forms of the messages of the hot path (a call, its answer): type -> (its header
#: name, to_values); header name -> (type, from_values).  See :func:`register_compact`.
_compact_out: dict[type, tuple[bytes, Callable[[Any], Any]]] = {}
_compact_in: dict[bytes, tuple[type, Callable[[tuple], Any]]] = {}
#: What a compact form's header names instead of ``module:name`` (no module name starts so).
_COMPACT_MARK = "="


def register_compact(cls: type, to_values: Callable[[Any], tuple | None], from_values: Callable[[tuple], Any]) -> None:
    """Send ``cls`` as the tuple of plain values (str, int, bytes, dict, list, None) that
    ``to_values(obj)`` returns, rebuilt by ``from_values(values)``; ``to_values`` returns None for an
    instance that must go as a usual pickle.

    Why: the pickler reduces a dataclass (and each dataclass in it) by calls into Python, and the
    unpickler looks its class up through the envelope's checks: ~10 us a call and its answer, per
    message, on both ends.  A tuple of plain values is one C call each way, and names no class at
    all, so its body is read by an unpickler that refuses every global.  ``from_values`` gets what
    a peer sent: anything it cannot take apart raises, and the message is dropped as malformed."""
    name = (_COMPACT_MARK + cls.__qualname__).encode()
    _compact_out[cls] = (name, to_values)
    _compact_in[name] = (cls, from_values)
    _compact_headers[_plain_header(name)] = from_values


#: The whole header of a compact message without buffers -> its from_values (decode's fast path).
_compact_headers: dict[bytes, Callable[[tuple], Any]] = {}

#: Raw forms: type -> (its whole header, to_bytes); whole header -> (type, from_bytes).
_raw_out: dict[type, tuple[bytes, Callable[[Any], bytes | None]]] = {}
_raw_in: dict[bytes, tuple[type, Callable[[Any], Any]]] = {}
_raw_names: dict[bytes, type] = {}


def register_raw(cls: type, to_bytes: Callable[[Any], bytes | None], from_bytes: Callable[[Any], Any]) -> None:
    """Send ``cls`` as the one body ``to_bytes(obj)`` makes (None: the compact or usual form), rebuilt
    by ``from_bytes(body)``, with no pickle at all: for a message that is a few numbers and a
    Pickled (an answer), ``struct`` reads it in a fraction of an unpickler's cost (a C Unpickler
    object alone costs more than pickle.loads of the whole tuple).  ``from_bytes`` gets what a peer
    sent: anything it cannot take apart raises, and the message is dropped as malformed."""
    name = (_COMPACT_MARK + cls.__qualname__ + "/raw").encode()
    header = _plain_header(name)
    _raw_out[cls] = (header, to_bytes)
    _raw_in[header] = (cls, from_bytes)
    _raw_names[name] = cls


def _loads_raw(body: Any, from_bytes: Callable[[Any], Any]) -> Any:
    try:
        return from_bytes(body)
    except Exception as e:
        raise WireError(f"undecodable body: {type(e).__name__}: {e}") from None


class _PlainUnpickler(pickle.Unpickler):
    """The unpickler of a compact body: plain values only, no class or function of any module."""

    def find_class(self, module: str, name: str) -> Any:
        raise EnvelopeError(f"a compact message may not name {module}.{name}")


def loads_plain(body: Any) -> Any:
    """A protocol 5 pickle of plain values (no class or function of any module may be named), checked
    first as a proc key's body is (:func:`check_pickle`): a raw message's receiver decodes it once
    per distinct prefix, whoever sent it, so the check costs nothing per message."""
    if bytes(body[:2]) != _PROTO_5:
        raise WireError("body is not a protocol 5 pickle")
    check_pickle(body)
    return _PlainUnpickler(io.BytesIO(body)).load()


def _loads_compact(body: Any, buffers: Sequence[Any], from_values: Callable[[tuple], Any]) -> Any:
    values = _PlainUnpickler(io.BytesIO(body), buffers=buffers).load()
    if type(values) is not tuple:
        raise WireError(f"a compact message's body is a {type(values).__name__}, not a tuple")
    return from_values(values)


_type_names: dict[type, bytes] = {}


def _type_name(cls: type) -> bytes:
    name = _type_names.get(cls)
    if name is None:
        name = _type_names[cls] = f"{cls.__module__}:{cls.__qualname__}".encode()
    return name


def message_type(frames: Sequence[Any]) -> type:
    """The type a message's header says it is, resolved as the envelope unpickler would (only
    monarch's message types), without looking at its body.  Raises :class:`WireError`."""
    try:
        header = bytes(memoryview(_buf(frames[0])))
        magic, version, nbuf = _HEADER.unpack_from(header)
    except (IndexError, struct.error, TypeError) as e:
        raise WireError(f"bad header: {e}") from None
    if magic != MAGIC or version != VERSION:
        raise WireError("bad magic or wire version")
    type_name = header[_HEADER.size + nbuf:]
    compact = _compact_in.get(type_name)
    if compact is not None:
        return compact[0]
    raw_cls = _raw_names.get(type_name)
    if raw_cls is not None:
        return raw_cls
    module, _, name = type_name.decode("ascii", "replace").partition(":")
    key = (module, name)
    cls = _envelope_globals.get(key)
    if cls is None:
        try:
            cls = _envelope_globals[key] = _envelope_global(module, name)
        except Exception as e:
            raise WireError(f"the header names {module}:{name}, not a message type ({e})") from None
    return cls


def frames_size(frames: Sequence[Any]) -> int:
    """The bytes a message's frames hold (a shared-memory segment counts as its announced length)."""
    total = 0
    try:
        header = memoryview(_buf(frames[0]))
        kinds = bytes(header[_HEADER.size:_HEADER.size + _HEADER.unpack_from(header)[2]])
    except (IndexError, struct.error, TypeError):
        return 0
    for i, f in enumerate(frames):
        f = _buf(f)
        n = f.nbytes if isinstance(f, memoryview) else len(f)
        if i >= 2 and i - 2 < len(kinds) and kinds[i - 2] == _KIND_SEGMENT and n == _SEGMENT.size:
            n = _SEGMENT.unpack(bytes(f))[0]
        total += n
    return total


def encode_parts(body: bytes, buffers: Sequence[pickle.PickleBuffer], fds: list[int] | None = None,
                 type_name: bytes = b"") -> list[Any]:
    if not buffers:
        return [_plain_header(type_name), body]
    kinds = bytearray()
    frames: list[Any] = [b"", body]
    made = 0
    try:
        for b in buffers:
            raw = b.raw()
            if fds is not None and raw.nbytes >= SHM_THRESHOLD and made < MAX_SEGMENTS:
                kinds.append(_KIND_SEGMENT)
                fds.append(shm.write(raw))
                made += 1
                frames.append(_SEGMENT.pack(raw.nbytes))
            else:
                kinds.append(_KIND_FRAME)
                frames.append(raw)
    except BaseException:
        if fds is not None and made:
            for fd in fds[len(fds) - made:]:
                os.close(fd)
            del fds[len(fds) - made:]
        raise
    frames[0] = _HEADER.pack(MAGIC, VERSION, len(buffers)) + bytes(kinds) + type_name
    return frames


def message_bytes(frames: Sequence[Any]) -> int:
    """How many bytes the message ``frames`` (from :func:`encode`) carries, its shared-memory
    segments included: what ``codec_max_frame_length`` measures."""
    n = 0
    for f in frames:
        n += memoryview(f).nbytes
    head = frames[0]
    if len(frames) > 2 and len(head) >= _HEADER.size:
        nbuf = _HEADER.unpack_from(head)[2]
        kinds = bytes(head[_HEADER.size:_HEADER.size + nbuf])
        for kind, f in zip(kinds, frames[2:]):
            if kind == _KIND_SEGMENT:
                n += _SEGMENT.unpack(f)[0] - memoryview(f).nbytes
    return n


#: The header of a message without buffers, per type name (most messages: one made per type).
_plain_headers: dict[bytes, bytes] = {}


def _plain_header(type_name: bytes) -> bytes:
    h = _plain_headers.get(type_name)
    if h is None:
        h = _plain_headers[type_name] = _HEADER.pack(MAGIC, VERSION, 0) + type_name
    return h


def decode(frames: Sequence[Any], fds: Sequence[int] = (), check: bool = False) -> Any:
    """The message in ``frames`` (and its segments' ``fds``, which it takes over).

    ``check``: the sender holds only a proc's key; its body is checked (:func:`check_pickle`)
    before the unpickler sees it.  Raises :class:`WireError` if they are not one.
    """
    if not fds and not check and len(frames) == 2:
        # The hot path: a raw or compact call or answer without buffers, known by its whole header
        # (raw first: a call that waits for its answer, and the answer, are raw).
        head = frames[0]
        from_values = None
        if type(head) is bytes:
            raw = _raw_in.get(head)
            if raw is not None:
                try:  # _loads_raw written out: one Python call less per message
                    return raw[1](frames[1])
                except Exception as e:
                    raise WireError(f"undecodable body: {type(e).__name__}: {e}") from None
            from_values = _compact_headers.get(head)
        if from_values is not None:
            body = frames[1]
            if body[:2] != _PROTO_5:
                raise WireError("body is not a protocol 5 pickle")
            try:
                return _loads_compact(body, (), from_values)
            except Exception as e:  # a malformed pickle can raise nearly anything
                raise WireError(f"undecodable body: {type(e).__name__}: {e}") from None
    fds = list(fds)
    try:
        return _decode(frames, fds, check)
    finally:
        for fd in fds:  # whatever was not mapped
            os.close(fd)


def _decode(frames: Sequence[Any], fds: list[int], check: bool = False) -> Any:
    try:
        header = memoryview(_buf(frames[0]))
        magic, version, nbuf = _HEADER.unpack_from(header)
    except (IndexError, struct.error, TypeError) as e:
        raise WireError(f"bad header: {e}") from None
    if magic != MAGIC:
        raise WireError("bad magic")
    if version != VERSION:
        raise WireError(f"wire version {version}, expected {VERSION}")
    kinds = bytes(header[_HEADER.size : _HEADER.size + nbuf])
    if len(kinds) != nbuf or len(frames) != 2 + nbuf:
        raise WireError(f"expected {nbuf} buffers, got {len(frames) - 2} frames")
    if kinds.count(_KIND_SEGMENT) != len(fds):
        raise WireError(f"{kinds.count(_KIND_SEGMENT)} shared-memory buffers, {len(fds)} descriptors")
    type_name = bytes(header[_HEADER.size + nbuf:])
    if type_name in _raw_names:  # a raw form (no pickle in it): one body, nothing beside it
        if nbuf or fds:
            raise WireError("a raw message with buffers")
        return _loads_raw(_buf(frames[1]), _raw_in[_plain_header(type_name)][1])
    try:
        body = _buf(frames[1])
        proto = bytes(memoryview(body)[:2])
    except TypeError as e:
        raise WireError(f"bad body: {e}") from None
    if proto != _PROTO_5:
        # Every body we write starts so; anything else never reaches the unpickler.
        raise WireError("body is not a protocol 5 pickle")
    if check:
        check_pickle(body)
    compact = _compact_in.get(type_name)
    buffers = []
    try:
        for kind, f in zip(kinds, frames[2:]):
            if kind == _KIND_FRAME:
                buffers.append(_buf(f))
            elif kind == _KIND_SEGMENT:
                (length,) = _SEGMENT.unpack(bytes(_buf(f)))
                if length > MAX_FRAME_BYTES:
                    raise WireError(f"a {length}-byte segment is over the {MAX_FRAME_BYTES}-byte limit")
                buffers.append(shm.read(fds.pop(0), length))
            else:
                raise WireError(f"unknown buffer kind {kind}")
        if compact is not None:
            return _loads_compact(body, buffers, compact[1])
        return loads_envelope(body, buffers)
    except WireError:
        raise
    except Exception as e:  # a malformed pickle can raise nearly anything
        raise WireError(f"undecodable body: {type(e).__name__}: {e}") from None


def _buf(frame: Any) -> Any:
    return frame.buffer if hasattr(frame, "buffer") else frame
