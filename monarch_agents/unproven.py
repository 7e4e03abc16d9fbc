"""A cap on the connections a listener holds before they show who they are, and who a local peer is.

Another local user can open connections to any port on loopback and send nothing.  A listener
that gives each a thread (or a descriptor) until a deadline would run out of one or the other,
and one that refuses new connections once full keeps its owner out for as long as the stranger
keeps the slots busy.  So each listener that authenticates after ``accept`` admits at most
``limit`` such connections, and one more shuts the *oldest* down (its reader sees EOF and ends):
a real client is never held back longer than it takes it to prove itself.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass


class UnprovenConnections:
    """Connections accepted but not yet authenticated, at most ``limit`` (one more sheds the oldest)."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self._lock = threading.Lock()
        self._since: dict[socket.socket, float] = {}
        #: Connections shut down to make room for newer ones.
        self.shed = 0

    def admit(self, conn: socket.socket) -> None:
        """Hold ``conn`` until :meth:`proven`; the oldest held one is shut down if there is no room."""
        with self._lock:
            if len(self._since) >= self.limit:
                oldest = min(self._since, key=self._since.__getitem__)
                del self._since[oldest]
                self.shed += 1
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)  # its reader sees EOF and closes it
            self._since[conn] = time.monotonic()

    def proven(self, conn: socket.socket) -> None:
        """``conn`` has authenticated (or is gone): it no longer counts."""
        with self._lock:
            self._since.pop(conn, None)

    def shut_all(self) -> None:
        """Shut down every connection still held (the listener is closing)."""
        with self._lock:
            held, self._since = list(self._since), {}
        for conn in held:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __len__(self) -> int:
        with self._lock:
            return len(self._since)


def _ip_port(host: str, port: int) -> tuple[str, int]:
    """An address as compared with the kernel's tables: an IPv4-mapped IPv6 address as its IPv4 one
    (a dual-stack listener's peer is ``::ffff:a.b.c.d`` there, ``a.b.c.d`` in the peer's own row)."""
    ip = ipaddress.ip_address(host.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), port


def _proc_net_addr(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` as ``/proc/net/tcp[6]`` writes it (each 32-bit word of the address in host order)."""
    addr, _, port = text.partition(":")
    raw = bytes.fromhex(addr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return _ip_port(str(ipaddress.ip_address(raw)), int(port, 16))


@dataclass(frozen=True)
class TcpRow:
    """One TCP socket of this network namespace, as the kernel lists it."""

    local: tuple[str, int]
    remote: tuple[str, int]
    uid: int
    inode: int


def tcp_rows() -> list[TcpRow]:
    """Every TCP socket of this network namespace (``/proc/net/tcp`` and ``tcp6``), read once."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    rows.append(TcpRow(_proc_net_addr(cols[1]), _proc_net_addr(cols[2]), int(cols[7]), int(cols[9])))
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return rows


def local_peer_uid(conn: socket.socket) -> int | None:
    """The uid that owns the other end of ``conn`` when that end is a socket of this machine (the
    kernel's own table, ``/proc/net/tcp[6]``); None for a peer elsewhere, or where it cannot be told."""
    try:
        theirs, ours = _ip_port(*conn.getpeername()[:2]), _ip_port(*conn.getsockname()[:2])
    except (OSError, ValueError, TypeError):
        return None
    for row in tcp_rows():
        if row.local == theirs and row.remote == ours:
            return row.uid
    return None


def strangers(inodes: set[int]) -> set[int]:
    """Of these sockets (by inode: ``os.fstat(fd).st_ino``), the connections whose other end is a
    socket of this machine that another user owns (one read of the kernel's tables for them all)."""
    rows = tcp_rows()
    owners = {(r.local, r.remote): r.uid for r in rows}
    me = os.getuid()
    out = set()
    for r in rows:
        if r.inode in inodes:
            uid = owners.get((r.remote, r.local))
            if uid is not None and uid != me:
                out.add(r.inode)
    return out
