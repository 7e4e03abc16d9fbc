"""The one place that decides how chunks move between hosts: RDMA or TCP, and why.

RDMA is possible only where ``pyverbs`` imports and finds a device.  Even
then this build moves chunks over the agents' CURVE/TCP connections (and
shared memory between processes of one host): the RDMA data path (registered
buffers, one-sided reads) is not written yet, and the reason says so, so that
``monarch status`` never claims a transport that is not in use.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TransportChoice:
    """``kind`` is "rdma" or "tcp"; ``reason`` says why, in a user's words."""

    kind: str
    reason: str
    devices: tuple[str, ...] = ()


def rdma_devices() -> tuple[tuple[str, ...], str]:
    """(device names, '' ) where pyverbs finds devices; ((), why not) otherwise."""
    if os.environ.get("MONARCH_RDMA") == "0":
        return (), "RDMA turned off (MONARCH_RDMA=0)"
    try:
        from pyverbs.device import get_device_list  # type: ignore[import-not-found]
    except ImportError:
        # Suggest pyverbs only where it would find something: the kernel lists RDMA devices here.
        if not _kernel_rdma_devices():
            return (), "no RDMA device (the kernel lists none in /sys/class/infiniband)"
        return (), "pyverbs is not installed (pip install pyverbs, with rdma-core)"
    except Exception as e:  # a broken rdma-core install shows up here, not as ImportError
        return (), f"pyverbs cannot load: {e}"
    try:
        devices = get_device_list()
    except Exception as e:
        return (), f"no RDMA device ({_first_line(e)})"
    names = tuple(d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices)
    if not names:
        return (), "no RDMA device (ibverbs lists none)"
    return names, ""


def _kernel_rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir(os.environ.get("MONARCH_SYS_INFINIBAND", "/sys/class/infiniband")))
    except OSError:
        return []


def choose_transport() -> TransportChoice:
    """How chunks move from this host to the next one."""
    devices, why = rdma_devices()
    if not devices:
        return TransportChoice("tcp", why)
    return TransportChoice("tcp", f"RDMA device {devices[0]} found, but this build has no RDMA data path yet", devices)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def choose_buffer_path(*, same_host: bool, same_process: bool, write: bool, cma_refused: bool) -> TransportChoice:
    """How the bytes of one ``RDMABuffer`` transfer move (``monarch_agents/rdma_buffers.py``).

    ``local`` (a memmove), ``cma`` (a read straight out of the owner's memory on this host,
    ``process_vm_readv``), ``shm`` (through the owner, in a shared-memory segment) or ``tcp``
    (through the owner, over the job's connection to its host).
    """
    if same_process:
        return TransportChoice("local", "the buffer's owner is this process")
    if same_host:
        if write:
            return TransportChoice("shm", "writes go through the owner (it alone knows its memory is still in use)")
        if cma_refused:
            return TransportChoice("shm", "the kernel refuses cross-memory reads here (ptrace_scope)")
        if os.environ.get("MONARCH_RDMA_CMA") == "0":
            return TransportChoice("shm", "cross-memory reads turned off (MONARCH_RDMA_CMA=0)")
        return TransportChoice("cma", "same host: read straight out of the owner's memory")
    devices, why = _devices_once()
    if devices:
        return TransportChoice("tcp", f"RDMA device {devices[0]} found, but this build has no RDMA data path yet", devices)
    return TransportChoice("tcp", why)


@functools.cache
def _devices_once() -> tuple[tuple[str, ...], str]:
    return rdma_devices()  # a failed import of pyverbs is not cached by Python: ask once per process
