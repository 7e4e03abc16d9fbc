"""Registered memory that other processes read and write: the engine under ``monarch.rdma``.

A process *registers* a range of its memory (a 1-D contiguous CPU tensor or
memoryview) and gets a :class:`BufferHandle`, a small record any process of the
job may hold.  A holder moves bytes with :func:`read_into` and
:func:`write_from`; :func:`drop` releases the registration.

How the bytes move is decided per transfer by ``monarch_rdmafs.rdma.choose_buffer_path``:

* **same process**: one ``memmove``;
* **same host, read**: one ``process_vm_readv`` straight out of the owner's memory
  (``monarch_agents/cma.py``), with no message and nothing for the owner to do, as an
  RDMA read would;
* **same host, write; or where the kernel refuses cross-memory reads**: a message to the
  owner, whose runtime copies on its IO thread; the bytes ride in a shared-memory segment
  (``monarch_agents/shm.py``), so they are copied twice and never pickled;
* **another host**: the same message over the job's CURVE/TCP connection.

Every registration has a *state word* in the owner's memory holding its generation
while it is live and 0 once dropped.  A cross-memory read checks it before and after
the copy, so a read that overlaps a drop (whose memory may already be reused) fails
instead of returning someone else's bytes.  An owner that dies fails the reader: a
cross-memory read sees its pidfd close, a message sees the runtime's supervision
error; both raise :class:`RDMAError` naming the owner.

What this module does not do: move GPU memory, or use ibverbs (where a device exists
the choice says so and the transfer takes the paths above).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import pickle
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from monarch_agents import cma
from monarch_agents.errors import SupervisionError
from monarch_agents.future import Future
from monarch_agents.messages import Message, PortRef, Reply, message

log = logging.getLogger("monarch.rdma_buffers")

__all__ = ["BufferHandle", "RDMAError", "drop", "read_into", "register", "write_from"]


class RDMAError(Exception):
    """A transfer that could not be done: the buffer was dropped, its owner died, a size is wrong."""


@dataclass(frozen=True, slots=True)
class BufferHandle:
    """A registered range of one process's memory, as any process of the job may hold it."""

    owner: str  # the owner's runtime address
    host: str  # cma.host_key() of the owner's host
    host_name: str
    pid: int
    started: int  # the owner's start time: its pid cannot be mistaken for another process's
    buf_id: int
    addr: int
    size: int
    state: int  # address of the registration's state word in the owner's memory
    generation: int

    def describe(self) -> str:
        return f"RDMABuffer of {self.size} bytes owned by pid {self.pid} on {self.host_name or '?'}"

    def __reduce__(self) -> tuple:
        # Sent to a peer of another of this client's runtimes (a job of its own keys): that runtime
        # answers for the buffer, as the one its peers can reach.
        return (BufferHandle, (_owner_for_peer(self.owner), self.host, self.host_name, self.pid, self.started,
                               self.buf_id, self.addr, self.size, self.state, self.generation))


def _owner_for_peer(owner: str) -> str:
    """The owner address to hand the peer being pickled for: ``owner``, or, when ``owner`` is another
    runtime of this client than the sending one, the sending one (made to serve the registrations)."""
    from monarch_agents import runtime

    dest = runtime.pickling_dest()
    if dest is None or dest.addr == owner or not runtime.own_address(owner):
        return owner
    _serve(dest)
    return dest.addr


# --- messages to the owner -------------------------------------------------------------


@message
class RdmaRead(Message):
    buf_id: int
    generation: int
    offset: int
    length: int
    reply: PortRef


@message
class RdmaWrite(Message):
    buf_id: int
    generation: int
    offset: int
    data: Any  # a PickleBuffer on the way, a memoryview on arrival
    reply: PortRef


@message
class RdmaDrop(Message):
    buf_id: int
    generation: int
    reply: PortRef | None


# --- the owner's side ------------------------------------------------------------------

_BLOCK = 1024


@dataclass(slots=True)
class _Entry:
    keep: Any  # the object whose memory is registered: kept alive until the drop
    addr: int
    size: int
    word: Any  # ctypes.c_uint64 at the state address
    slot: tuple[int, int]
    generation: int


class _Registry:
    """This process's registrations and their state words (which never move once made)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocks: list[Any] = []
        self.free: list[tuple[int, int]] = []
        self.entries: dict[int, _Entry] = {}
        self.ids = itertools.count(1)
        self.generations = itertools.count(1)
        self.pid = os.getpid()
        #: The runtimes that answer for these registrations (a client of several jobs: each it sent one to).
        self.served: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def add(self, keep: Any, addr: int, size: int) -> tuple[int, _Entry]:
        with self.lock:
            if not self.free:
                block = (ctypes.c_uint64 * _BLOCK)()
                self.blocks.append(block)
                b = len(self.blocks) - 1
                self.free.extend((b, i) for i in range(_BLOCK - 1, -1, -1))
            b, i = self.free.pop()
            word = ctypes.c_uint64.from_buffer(self.blocks[b], i * 8)
            gen = next(self.generations)
            word.value = gen
            buf_id = next(self.ids)
            e = self.entries[buf_id] = _Entry(keep, addr, size, word, (b, i), gen)
            return buf_id, e

    def get(self, buf_id: int, generation: int) -> _Entry | None:
        e = self.entries.get(buf_id)
        return e if e is not None and e.generation == generation else None

    def drop(self, buf_id: int, generation: int) -> bool:
        with self.lock:
            e = self.entries.get(buf_id)
            if e is None or e.generation != generation:
                return False
            e.word.value = 0  # before the memory can go: a reader that overlaps sees it
            del self.entries[buf_id]
            self.free.append(e.slot)
        return True


_registry: _Registry | None = None
_registry_lock = threading.Lock()


def _reg() -> _Registry:
    global _registry
    r = _registry
    if r is None or r.pid != os.getpid():
        with _registry_lock:
            if _registry is None or _registry.pid != os.getpid():
                _registry = _Registry()
            r = _registry
    return r


def _runtime() -> Any:
    from monarch_agents import runtime

    return runtime.ensure()


def _serve(rt: Any) -> None:
    """Answer reads, writes and drops of this process's registrations (once per runtime)."""
    reg = _reg()
    if rt in reg.served:
        return
    with _registry_lock:
        if rt in reg.served:
            return

        def answer(port: PortRef, ok: bool, value: Any) -> None:
            try:
                rt.send(port.addr, Reply(port.port_id, 0, ok, value))
            except Exception as e:  # the asker is gone
                log.debug("could not answer %s: %s", port, e)

        def on_read(msg: RdmaRead) -> None:
            e = reg.get(msg.buf_id, msg.generation)
            if e is None:
                answer(msg.reply, False, RDMAError("the RDMABuffer was dropped by its owner; it cannot be read"))
                return
            if msg.offset < 0 or msg.length < 0 or msg.offset + msg.length > e.size:
                answer(msg.reply, False, RDMAError(f"bytes {msg.offset}..{msg.offset + msg.length} are outside an "
                                                   f"RDMABuffer of {e.size}"))
                return
            view = (ctypes.c_char * msg.length).from_address(e.addr + msg.offset)
            answer(msg.reply, True, pickle.PickleBuffer(memoryview(view).cast("B")))

        def on_write(msg: RdmaWrite) -> None:
            e = reg.get(msg.buf_id, msg.generation)
            if e is None:
                answer(msg.reply, False, RDMAError("the RDMABuffer was dropped by its owner; it cannot be written"))
                return
            src = memoryview(msg.data).cast("B")
            if msg.offset < 0 or msg.offset + src.nbytes > e.size:
                answer(msg.reply, False, RDMAError(f"{src.nbytes} bytes at {msg.offset} do not fit an RDMABuffer "
                                                   f"of {e.size}"))
                return
            memoryview((ctypes.c_char * e.size).from_address(e.addr)).cast("B")[msg.offset: msg.offset + src.nbytes] = src
            answer(msg.reply, True, None)

        def on_drop(msg: RdmaDrop) -> None:
            reg.drop(msg.buf_id, msg.generation)
            if msg.reply is not None:
                answer(msg.reply, True, None)

        rt.register(RdmaRead, on_read)
        rt.register(RdmaWrite, on_write)
        rt.register(RdmaDrop, on_drop)
        reg.served.add(rt)


def register(obj: Any) -> BufferHandle:
    """Register ``obj``'s memory (a 1-D contiguous CPU tensor or memoryview) for others to read and write."""
    addr, size, keep = memory_range(obj, writable=False)
    if size == 0:
        raise ValueError("Cannot create RDMABuffer with size 0.")
    rt = _runtime()
    _serve(rt)
    reg = _reg()
    buf_id, e = reg.add(keep, addr, size)
    return BufferHandle(rt.addr, cma.host_key(), rt.host, os.getpid(), _my_start(), buf_id, addr, size,
                        ctypes.addressof(e.word), e.generation)


_started: tuple[int, int] | None = None


def _my_start() -> int:
    global _started
    if _started is None or _started[0] != os.getpid():
        _started = (os.getpid(), cma.start_time(os.getpid()))
    return _started[1]


# --- the holder's side -----------------------------------------------------------------


def memory_range(obj: Any, *, writable: bool) -> tuple[int, int, Any]:
    """(address, bytes, object to keep alive) of a 1-D contiguous CPU tensor or memoryview."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # a torch.Tensor, without importing torch
        if obj.device.type != "cpu":
            raise ValueError(f"RDMABuffer moves CPU memory only in this build (got a {obj.device.type} tensor)")
        if obj.dim() != 1 or not obj.is_contiguous():
            raise ValueError("RDMABuffer needs a 1-D contiguous tensor (e.g. t.view(torch.uint8).flatten())")
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj
    try:
        mv = memoryview(obj)
    except TypeError:
        raise ValueError(f"RDMABuffer needs a torch.Tensor or a memoryview, not {type(obj).__name__}") from None
    if mv.ndim != 1 or not mv.c_contiguous:
        raise ValueError("RDMABuffer needs a 1-D c-contiguous memoryview")
    if mv.nbytes == 0:
        return 0, 0, mv
    if mv.readonly:
        if writable:
            raise ValueError("cannot read into a read-only memoryview")
        import numpy

        return int(numpy.frombuffer(mv, dtype=numpy.uint8).ctypes.data), mv.nbytes, mv
    byte_view = mv.cast("B") if mv.format != "B" else mv
    return ctypes.addressof(ctypes.c_char.from_buffer(byte_view)), mv.nbytes, mv


#: Between hosts, transfers go in pieces of this size: one message the wire is busy with for seconds
#: would hold up the connection's heartbeats (and be taken for a dead peer), and memory stays bounded.
_CHUNK = 8 << 20
#: Set once the kernel refuses a cross-memory read here: later reads ask the owner at once.
_cma_refused = False


def _gone(handle: BufferHandle, why: str) -> RDMAError:
    return RDMAError(f"{handle.describe()} cannot be used: {why}")


def _check_word(handle: BufferHandle, value: int) -> None:
    if value != handle.generation:
        raise _gone(handle, "it was dropped")


def read_into(handle: BufferHandle, dst: Any) -> Future:
    """Copy the buffer's bytes into ``dst`` (at least as large); the future resolves once they are there."""
    from monarch_rdmafs.rdma import choose_buffer_path

    addr, n, keep = memory_range(dst, writable=True)
    if n < handle.size:
        raise ValueError(f"destination of {n} bytes is smaller than the {handle.size}-byte RDMABuffer")
    same_host = handle.host == cma.host_key()
    path = choose_buffer_path(same_host=same_host, same_process=same_host and handle.pid == os.getpid(),
                              write=False, cma_refused=_cma_refused)
    if path.kind == "local":
        _check_word(handle, ctypes.c_uint64.from_address(handle.state).value)
        cma.local_copy(addr, handle.addr, handle.size)
        return Future.completed(None)
    if path.kind == "cma":
        try:
            _cma_read(handle, addr)
            return Future.completed(None)
        except PermissionError:
            _refuse_cma()
        except RDMAError as e:
            f: Future = Future()
            f.set_exception(e)
            return f
    chunk = handle.size if same_host else _CHUNK
    return _all([_ask(handle, lambda port, o=o, n=min(chunk, handle.size - o):
                      RdmaRead(handle.buf_id, handle.generation, o, n, port),
                      lambda data, o=o: _copy_in(handle, data, addr + o, keep))
                 for o in range(0, handle.size, chunk)])


def _refuse_cma() -> None:
    global _cma_refused
    _cma_refused = True


def _cma_read(handle: BufferHandle, addr: int) -> None:
    try:
        p = cma.peer(handle.pid, handle.started)
        word = ctypes.c_uint64(0)
        p.read(handle.state, ctypes.addressof(word), 8)
        _check_word(handle, word.value)
        try:
            p.read(handle.addr, addr, handle.size)
        except OSError:
            # An unmapped range: most likely dropped and freed meanwhile, which the word tells.
            p.read(handle.state, ctypes.addressof(word), 8)
            _check_word(handle, word.value)
            raise
        p.read(handle.state, ctypes.addressof(word), 8)
        _check_word(handle, word.value)
    except cma.PeerGone:
        raise _gone(handle, "its owner died") from None
    except PermissionError:
        raise
    except OSError as e:
        raise _gone(handle, f"its memory could not be read ({e})") from None


def _copy_in(handle: BufferHandle, data: Any, addr: int, keep: Any) -> None:
    src = memoryview(data).cast("B")
    memoryview((ctypes.c_char * src.nbytes).from_address(addr)).cast("B")[:] = src
    return None


def _all(futures: list[Future]) -> Future:
    """One future for several: None once all are done, the first error otherwise."""
    if len(futures) == 1:
        return futures[0]
    out: Future = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def one(f: Future) -> None:
        e = f.exception()
        if e is not None:
            out.set_exception(e)
            return
        with lock:
            left[0] -= 1
            done = left[0] == 0
        if done:
            out.set_result(None)

    for f in futures:
        f.add_done_callback(one)
    return out


def write_from(handle: BufferHandle, src: Any) -> Future:
    """Copy ``src`` (at most the buffer's size) into the buffer, through its owner."""
    addr, n, keep = memory_range(src, writable=False)
    if n > handle.size:
        raise ValueError(f"source of {n} bytes exceeds the {handle.size}-byte RDMABuffer")
    if handle.pid == os.getpid() and handle.host == cma.host_key():
        _check_word(handle, ctypes.c_uint64.from_address(handle.state).value)
        cma.local_copy(handle.addr, addr, n)
        return Future.completed(None)
    view = memoryview((ctypes.c_char * n).from_address(addr)).cast("B") if n else memoryview(b"")
    chunk = max(n, 1) if handle.host == cma.host_key() else _CHUNK
    return _all([_ask(handle, lambda port, o=o: RdmaWrite(handle.buf_id, handle.generation, o,
                                                          pickle.PickleBuffer(view[o: o + chunk]), port),
                      lambda _: (keep, None)[1])
                 for o in range(0, max(n, 1), chunk)])


def drop(handle: BufferHandle) -> Future:
    """Release the registration; later reads and writes of it fail.  Dropping twice is harmless."""
    if handle.pid == os.getpid() and handle.host == cma.host_key():
        _reg().drop(handle.buf_id, handle.generation)
        return Future.completed(None)
    return _ask(handle, lambda port: RdmaDrop(handle.buf_id, handle.generation, port), lambda _: None)


def _ask(handle: BufferHandle, make: Any, then: Any) -> Future:
    rt = _runtime()
    out: Future = Future()
    inner = rt.request(handle.owner, make)

    def done(f: Future) -> None:
        try:
            value = f.get()
        except SupervisionError as e:
            out.set_exception(_gone(handle, f"its owner died ({e.message.splitlines()[0]})"))
            return
        except BaseException as e:
            out.set_exception(e)
            return
        try:
            out.set_result(then(value))
        except BaseException as e:
            out.set_exception(e)

    inner.add_done_callback(done)
    return out
