"""The one place that decides how chunks move between hosts: RDMA or TCP, and why.

RDMA is possible only where ``pyverbs`` imports and finds a device.  Even
then this build moves chunks over the agents' CURVE/TCP connections (and
shared memory between processes of one host): the RDMA data path (registered
buffers, one-sided reads) is not written yet, and the reason says so, so that
``monarch status`` never claims a transport that is not in use.
"""

from __future__ import annotations

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


def choose_transport() -> TransportChoice:
    """How chunks move from this host to the next one."""
    devices, why = rdma_devices()
    if not devices:
        return TransportChoice("tcp", why)
    return TransportChoice("tcp", f"RDMA device {devices[0]} found, but this build has no RDMA data path yet", devices)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
