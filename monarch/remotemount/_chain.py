"""The chain broadcast of ``monarch.remotemount``: a block goes from its source to worker 0, which
passes each chunk on to worker 1 the moment it lands, and so on down the chain, so the source sends
one copy whatever the number of workers.

PyTorch Monarch's is a Rust transport (``monarch._rust_bindings.monarch_extension.chain_broadcast``)
of its own listeners; here a hop is a port of the job's own transport (CURVE between hosts, an
authenticated Unix socket within one), so a chain needs no listener or key of its own and only a
holder of a worker's address (an unguessable port id, handed out through actor calls) can feed it.
The names and signatures are Monarch's; ``num_streams`` is accepted and has no effect (one
ordered connection per hop).

    server = serve()                     # on each worker: its address is server.addr
    ctx = new_ctx(BLOCK_SIZE)
    forward(server, next_addr_or_None, ctx)
    head = connect(addrs[0])             # at the source
    send_block(head, data, CHUNK, tag, size)
    ctx_wait_into(ctx, address, BLOCK_SIZE, size, timeout_ms)   # on each worker: the block, copied out
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from typing import Any, Optional

from monarch_agents.messages import PortRef, Reply

log = logging.getLogger(__name__)

_PREFIX = "monarch-port:"


def _runtime() -> Any:
    from monarch_agents.runtime import ensure

    return ensure()


def _parse(addr: str) -> PortRef:
    if not isinstance(addr, str) or not addr.startswith(_PREFIX) or "#" not in addr:
        raise ValueError(f"not a chain address: {addr!r} (expected '{_PREFIX}<proc address>#<port>')")
    where, _, port = addr[len(_PREFIX):].rpartition("#")
    try:
        return PortRef(where, int(port))
    except ValueError:
        raise ValueError(f"not a chain address: {addr!r} (the port is not a number)") from None


def _send(ref: PortRef, value: Any) -> None:
    from monarch_agents.messages import Pickled

    _runtime().send(ref.addr, Reply(ref.port_id, 0, True, Pickled.of(value)))


class ChainCtx:
    """Where a worker's blocks are put together: per tag, the bytes that came and how many."""

    def __init__(self, block_size: int):
        self.block_size = int(block_size)
        self._cond = threading.Condition()
        self._blocks: dict[int, list] = {}  # tag -> [bytearray, bytes received]
        self._order: list[int] = []
        self._closed = False

    def put(self, tag: int, offset: int, data: bytes, size: int) -> None:
        with self._cond:
            entry = self._blocks.get(tag)
            if entry is None:
                entry = self._blocks[tag] = [bytearray(min(size, self.block_size)), 0]
                self._order.append(tag)
            end = min(offset + len(data), len(entry[0]))
            if offset < end:
                entry[0][offset:end] = data[:end - offset]
                entry[1] += end - offset
            self._cond.notify_all()

    def take(self, want: int, timeout_s: float) -> bytearray:
        """The oldest block that has ``want`` bytes, once it has them."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the chain context is closed")
                for tag in self._order:
                    buf, got = self._blocks[tag]
                    if got >= want:
                        self._order.remove(tag)
                        del self._blocks[tag]
                        return buf
                left = deadline - time.monotonic()
                if left <= 0:
                    have = {t: self._blocks[t][1] for t in self._order}
                    raise TimeoutError(f"no block reached {want} bytes in {timeout_s:.0f} s (bytes so far: {have})")
                self._cond.wait(left)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ChainServer:
    """A worker's receiving end: a port of this process; chunks that come before :func:`forward` wait."""

    def __init__(self) -> None:
        self.port_id = 0
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._ref = _runtime().open_port(self)
        self._thread: threading.Thread | None = None

    @property
    def addr(self) -> str:
        return f"{_PREFIX}{self._ref.addr}#{self._ref.port_id}"

    # the port handler, called on the transport's IO thread: hand over, never block there
    def deliver(self, reply: Reply) -> None:
        if reply.ok:
            self._queue.put(reply.payload)

    def lost(self, addr: str, error: Any) -> None:
        pass  # a chain has one sender; its loss shows as a block that does not complete

    def start(self, successor: Optional[str], ctx: ChainCtx) -> None:
        nxt = _parse(successor) if successor is not None else None
        self._thread = threading.Thread(target=self._relay, args=(nxt, ctx), name="remotemount chain", daemon=True)
        self._thread.start()

    def _relay(self, nxt: Optional[PortRef], ctx: ChainCtx) -> None:
        while True:
            payload = self._queue.get()
            if payload is None:
                return
            chunk = payload.load() if hasattr(payload, "load") else payload
            if nxt is not None:
                try:
                    _send(nxt, chunk)  # on first: the next worker starts while this one copies
                except Exception as e:  # a lost successor: its block never completes and its wait says so
                    log.warning("the chain cannot reach its next worker %s: %s", nxt.addr, e)
            tag, offset, data, size = chunk
            ctx.put(tag, offset, data, size)

    def close(self) -> None:
        self._queue.put(None)


class ChainSession:
    """The source's end of a chain: the head worker's port."""

    def __init__(self, addr: str):
        self.addr = addr
        self._ref = _parse(addr)

    def send(self, chunk: tuple) -> None:
        _send(self._ref, chunk)


def new_ctx(block_size: int) -> ChainCtx:
    return ChainCtx(block_size)


def serve(bind_addr: Optional[str] = None) -> ChainServer:
    """A receiving end on this process's transport (``bind_addr`` is accepted and not needed)."""
    return ChainServer()


def serve_port(instance: Any = None) -> ChainServer:
    """The same as :func:`serve`: every hop is already a port."""
    return ChainServer()


def connect(addr: str, num_streams: int = 1) -> ChainSession:
    return ChainSession(addr)


def validate_port_addr(addr: str) -> None:
    _parse(addr)


def send_block(session: ChainSession, data: bytes, chunk_size: int, tag: int, size: Optional[int] = None) -> int:
    """Send the first ``size`` bytes of ``data`` (all of it by default) as block ``tag``, ``chunk_size`` at a time."""
    size = len(data) if size is None else int(size)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, not {chunk_size}")
    view = memoryview(data)[:size]
    if size == 0:
        session.send((int(tag), 0, b"", 0))
    for off in range(0, size, chunk_size):
        session.send((int(tag), off, bytes(view[off:off + chunk_size]), size))
    return size


def send_block_to_port(instance: Any, port: str, data: bytes, chunk_size: int, tag: int,
                       size: Optional[int] = None) -> int:
    return send_block(connect(port), data, chunk_size, tag, size)


def forward(server: ChainServer, successor: Optional[str], ctx: ChainCtx, num_streams: int = 1) -> None:
    """Relay what ``server`` receives to ``successor`` (None: the tail) and put it together in ``ctx``."""
    server.start(successor, ctx)


def ctx_wait_into(ctx: ChainCtx, dst_addr: int, dst_len: int, want: int, timeout_ms: int) -> None:
    """Wait until a block has ``want`` bytes, then copy them to the memory at ``dst_addr``."""
    if want > dst_len:
        raise ValueError(f"want {want} bytes but the destination holds {dst_len}")
    buf = ctx.take(int(want), timeout_ms / 1000.0)
    if want:
        src = (ctypes.c_char * want).from_buffer(buf)
        ctypes.memmove(dst_addr, src, want)


def ctx_close(ctx: ChainCtx) -> None:
    ctx.close()
