"""Framing: one message <-> a list of ZeroMQ frames.

A message on the wire is::

    [header, body, buf_0, buf_1, ...]

``header`` is a fixed struct (magic, version, number of buffers) followed by one
kind byte per buffer: ``0`` the buffer travels as its own frame, ``1`` the frame
holds a shared-memory descriptor (the buffer itself was written to /dev/shm by a
sender on the same host).  ``body`` is pickle protocol 5; large buffers (NumPy
arrays, tensors, big ``bytes``) are taken out of band so they are never copied
into the pickle stream.

This is the only module that calls ``pickle``.  It is only ever handed frames
from a CURVE-authenticated socket (see ``agents/transport.py``); anything that
does not decode raises :class:`WireError`, which the receive loop logs and drops.

What this module does not do: compression, or encryption (CURVE does that).
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
import sys
import uuid
from typing import Any, Sequence

import cloudpickle

MAGIC = b"MNRC"
VERSION = 1
_HEADER = struct.Struct("!4sHI")  # magic, version, number of out-of-band buffers

#: Buffers at least this large leave the pickle stream as their own frame.
OOB_THRESHOLD = 64 * 1024
#: Buffers at least this large go through shared memory when the peer shares our host.
SHM_THRESHOLD = 1 << 20

_PROTO_5 = b"\x80\x05"  # how a pickle protocol 5 stream begins
_KIND_FRAME = 0
_KIND_SHM = 1
SHM_DIR = "/dev/shm"
_SHM_PREFIX = "monarch-"


class WireError(Exception):
    """A frame list that is not a well-formed monarch message."""


def _rebuild_bytes(buf: Any) -> bytes:
    return bytes(buf)


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


class _Pickler(cloudpickle.Pickler):
    """Pickle 5 with out-of-band buffers for big bytes and CPU tensors.

    cloudpickle pickles by value only what cannot be imported (classes and
    functions from ``__main__``); everything importable goes by reference.
    """

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if t is bytes and len(obj) >= OOB_THRESHOLD:
            return _rebuild_bytes, (pickle.PickleBuffer(obj),)
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
_REDO_MARKERS = (b"__main__",)


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
    f = io.BytesIO()
    try:
        p = pickle.Pickler(f, protocol=5, buffer_callback=_keep_into(buffers))
        table = _tensor_dispatch()
        if table is not None:
            p.dispatch_table = table
        p.dump(obj)
        body = f.getvalue()
    except Exception:
        body = None
    if body is not None and not any(m in body for m in _REDO_MARKERS):
        return body, buffers
    return dumps_full(obj)


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
    """Inverse of :func:`dumps`."""
    return pickle.loads(body, buffers=buffers)


def encode(obj: Any, *, same_host: bool = False) -> list[Any]:
    """Frames for a monarch message. With ``same_host``, large buffers go through /dev/shm.

    Messages are our own dataclasses, so the plain C pickler does; user values
    inside them are already :class:`~agents.messages.Pickled`.
    """
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=_keep_into(buffers))
    return encode_parts(body, buffers, same_host=same_host)


def encode_parts(body: bytes, buffers: Sequence[pickle.PickleBuffer], *, same_host: bool = False) -> list[Any]:
    kinds = bytearray()
    frames: list[Any] = [b"", body]
    for b in buffers:
        raw = b.raw()
        if same_host and raw.nbytes >= SHM_THRESHOLD:
            kinds.append(_KIND_SHM)
            frames.append(_to_shm(raw))
        else:
            kinds.append(_KIND_FRAME)
            frames.append(raw)
    frames[0] = _HEADER.pack(MAGIC, VERSION, len(buffers)) + bytes(kinds)
    return frames


def decode(frames: Sequence[Any]) -> Any:
    """The message in ``frames``; raises :class:`WireError` if they are not one."""
    try:
        header = memoryview(_buf(frames[0]))
        magic, version, nbuf = _HEADER.unpack_from(header)
    except (IndexError, struct.error, TypeError) as e:
        raise WireError(f"bad header: {e}") from None
    if magic != MAGIC:
        raise WireError("bad magic")
    if version != VERSION:
        raise WireError(f"wire version {version}, expected {VERSION}")
    kinds = bytes(header[_HEADER.size :])
    if len(kinds) != nbuf or len(frames) != 2 + nbuf:
        raise WireError(f"expected {nbuf} buffers, got {len(frames) - 2} frames")
    try:
        body = _buf(frames[1])
        proto = bytes(memoryview(body)[:2])
    except TypeError as e:
        raise WireError(f"bad body: {e}") from None
    if proto != _PROTO_5:
        # Every body we write starts so; anything else never reaches the unpickler.
        raise WireError("body is not a protocol 5 pickle")
    buffers = []
    try:
        for kind, f in zip(kinds, frames[2:]):
            if kind == _KIND_FRAME:
                buffers.append(_buf(f))
            elif kind == _KIND_SHM:
                buffers.append(_from_shm(bytes(_buf(f))))
            else:
                raise WireError(f"unknown buffer kind {kind}")
        return loads(body, buffers)
    except WireError:
        raise
    except Exception as e:  # a malformed pickle can raise nearly anything
        raise WireError(f"undecodable body: {type(e).__name__}: {e}") from None


def _buf(frame: Any) -> Any:
    return frame.buffer if hasattr(frame, "buffer") else frame


def _to_shm(raw: memoryview) -> bytes:
    name = _SHM_PREFIX + uuid.uuid4().hex
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        view = raw.cast("B")
        written = 0
        while written < view.nbytes:
            written += os.write(fd, view[written:])
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return name.encode()


def _from_shm(name: bytes) -> memoryview:
    text = name.decode()
    if not text.startswith(_SHM_PREFIX) or "/" in text or len(text) > 64:
        raise WireError("bad shared-memory name")
    path = os.path.join(SHM_DIR, text)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        raise WireError(f"shared memory segment gone: {e}") from None
    try:
        # Unlinked at once: the mapping keeps the pages alive exactly as long as
        # the objects built on it, and nothing is left behind in /dev/shm.
        os.unlink(path)
        size = os.fstat(fd).st_size
        if size == 0:
            return memoryview(bytearray())
        return memoryview(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
    finally:
        os.close(fd)


def discard(frames: Sequence[Any]) -> None:
    """Remove shared-memory segments of a message that will never be decoded."""
    try:
        header = memoryview(_buf(frames[0]))
        _, _, nbuf = _HEADER.unpack_from(header)
        kinds = bytes(header[_HEADER.size :])
        for kind, f in zip(kinds, frames[2:]):
            if kind == _KIND_SHM:
                text = bytes(_buf(f)).decode()
                if text.startswith(_SHM_PREFIX) and "/" not in text:
                    try:
                        os.unlink(os.path.join(SHM_DIR, text))
                    except OSError:
                        pass
    except Exception:
        pass
