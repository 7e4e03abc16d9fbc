"""``monarch.rdma``: buffers that other actors read and write directly, as in PyTorch Monarch.

    class Weights(Actor):
        def __init__(self):
            self.w = torch.rand(1000, 1000)
            self.buf = RDMABuffer(self.w.view(torch.uint8).flatten())   # registered once

        @endpoint
        def handle(self) -> RDMABuffer:
            return self.buf                                             # a small reference

    # in another actor (or the client):
    buf.read_into(local.view(torch.uint8).flatten()).get()
    buf.write_from(t.view(torch.uint8).flatten()).get()
    buf.drop().get()

The bytes move on a data plane apart from messages (``monarch_agents/rdma_buffers.py``):
between procs of one host a read copies straight out of the owner's memory
(``process_vm_readv``); writes, and reads from other hosts, go through the owner's
runtime (shared memory on one host, the job's TCP connection between hosts).
``monarch_rdmafs.rdma`` is the one place that chooses.  Where we differ on purpose:
no ``configure(rdma_allow_tcp_fallback=True)`` is needed (there is always a path), and
``is_rdma_available()`` says whether ``RDMABuffer`` works here (always), where Monarch
0.7 deprecated it as a synonym of ``is_ibverbs_available()``.  GPU memory is not
supported.
"""

from __future__ import annotations

from typing import Any

from monarch_agents import rdma_buffers
from monarch_agents.future import Future
from monarch_agents.rdma_buffers import BufferHandle, RDMAError

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMAError",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]


class RDMAReadTransferWarning(Warning):
    pass


class RDMAWriteTransferWarning(Warning):
    pass


class RDMATcpFallbackWarning(Warning):
    pass


def is_ibverbs_available() -> bool:
    """Whether an ibverbs device is visible (pyverbs imports and lists one)."""
    from monarch_rdmafs.rdma import rdma_devices

    return bool(rdma_devices()[0])


def is_rdma_available() -> bool:
    """Whether ``RDMABuffer`` can be used here: always (shared memory on a host, TCP between hosts)."""
    return True


def get_rdma_backend() -> str:
    """'ibverbs' where a device is visible, else 'tcp' (the path between hosts; one host uses its memory)."""
    return "ibverbs" if is_ibverbs_available() else "tcp"


class RDMABuffer:
    """A 1-D contiguous CPU tensor or memoryview that other processes may read and write.

    The memory is not copied: the buffer refers to it until :meth:`drop`.  It is up to the
    program not to change it while a transfer runs.  Pass the buffer to other actors (it
    pickles as a small reference); a dropped buffer, or one whose owner died, raises
    :class:`RDMAError` when used.
    """

    def __init__(self, data: Any) -> None:
        self._handle: BufferHandle = rdma_buffers.register(data)

    @classmethod
    def _of(cls, handle: BufferHandle) -> "RDMABuffer":
        b = cls.__new__(cls)
        b._handle = handle
        return b

    def __reduce__(self) -> Any:
        return RDMABuffer._of, (self._handle,)

    @property
    def backend(self) -> str:
        return get_rdma_backend()

    @property
    def owner(self) -> str:
        """The owning process's address."""
        return self._handle.owner

    def size(self) -> int:
        """The buffer's length in bytes."""
        return self._handle.size

    def read_into(self, dst: Any, *, timeout: int = 60) -> Future[None]:
        """Copy the buffer into ``dst`` (a 1-D contiguous tensor or writable memoryview of at least
        ``size()`` bytes); the future resolves to None once the bytes are there."""
        return rdma_buffers.read_into(self._handle, dst)

    def write_from(self, src: Any, *, timeout: int = 60) -> Future[None]:
        """Copy ``src`` (at most ``size()`` bytes) into the buffer."""
        return rdma_buffers.write_from(self._handle, src)

    def drop(self) -> Future[None]:
        """Release the buffer: its owner lets go of the memory, and later transfers fail."""
        return rdma_buffers.drop(self._handle)

    def __repr__(self) -> str:
        return f"<RDMABuffer {self._handle.size} bytes, owner pid {self._handle.pid} on {self._handle.host_name}>"


class RDMAAction:
    """Several reads and writes submitted as one unit: :meth:`submit`'s future resolves when all are done."""

    def __init__(self) -> None:
        self._ops: list[tuple[str, Any, Any]] = []

    def read_remote(self, dst: Any, src: RDMABuffer) -> "RDMAAction":
        self._ops.append(("read", dst, src))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> "RDMAAction":
        self._ops.append(("write", dst, src))
        return self

    def fetch_add(self, src: RDMABuffer, dst: Any, add: int) -> "RDMAAction":
        raise NotImplementedError("Not yet supported")

    def compare_and_swap(self, src: RDMABuffer, dst: Any, compare: int, swap: int) -> "RDMAAction":
        raise NotImplementedError("Not yet supported")

    def submit(self, *, timeout: int = 60) -> Future[None]:
        futures = [buf.read_into(local) if kind == "read" else buf.write_from(local)
                   for kind, local, buf in ((k, a, b) if k == "read" else (k, b, a) for k, a, b in self._ops)]
        out: Future = Future()
        left = [len(futures)]

        def one(f: Future) -> None:
            e = f.exception()
            if e is not None:
                out.set_exception(e)
                return
            left[0] -= 1
            if left[0] == 0:
                out.set_result(None)

        if not futures:
            out.set_result(None)
        for f in futures:
            f.add_done_callback(one)
        return out
