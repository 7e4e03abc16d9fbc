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


#: How ``/proc/net/tcp6`` writes the first 12 bytes of an IPv4-mapped address (``::ffff:a.b.c.d``).
_MAPPED = "0000000000000000FFFF0000" if sys.byteorder == "little" else "00000000000000000000FFFF"


def _norm(text: str) -> str:
    """A table's ``ADDR:PORT`` with an IPv4-mapped address written as its IPv4 one (a dual-stack
    listener's peer is ``::ffff:a.b.c.d`` in its row, ``a.b.c.d`` in the peer's own)."""
    return text[24:] if len(text) == 37 and text.startswith(_MAPPED) else text


def _proc_net_addr(host: str, port: int) -> str:
    """A socket's address as the tables write it (each 32-bit word in host order), IPv4 if mapped."""
    ip = ipaddress.ip_address(host.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    raw = ip.packed
    words = [raw[i:i + 4] for i in range(0, len(raw), 4)]
    return "".join((w[::-1] if sys.byteorder == "little" else w).hex().upper() for w in words) + f":{port:04X}"


def tcp_rows() -> list[tuple[str, str, str, str]]:
    """Every TCP socket of this network namespace, read once from ``/proc/net/tcp`` and ``tcp6``:
    (local, remote, uid, inode) as the kernel writes them, mapped addresses as IPv4.  Kept as text:
    a flood makes thousands of rows, read for every batch of accepted connections."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9:
                        rows.append((_norm(cols[1]), _norm(cols[2]), cols[7], cols[9]))
        except (OSError, StopIteration):
            continue
    return rows


def local_peer_uid(conn: socket.socket) -> int | None:
    """The uid that owns the other end of ``conn`` when that end is a socket of this machine (the
    kernel's own table, ``/proc/net/tcp[6]``); None for a peer elsewhere, or where it cannot be told."""
    try:
        theirs, ours = _proc_net_addr(*conn.getpeername()[:2]), _proc_net_addr(*conn.getsockname()[:2])
    except (OSError, ValueError, TypeError):
        return None
    for local, remote, uid, _ in tcp_rows():
        if local == theirs and remote == ours:
            return int(uid)
    return None


def strangers(inodes: set[int]) -> set[int]:
    """Of these sockets (by inode: ``os.fstat(fd).st_ino``), the connections whose other end is a
    socket of this machine that another user owns (one read of the kernel's tables for them all)."""
    rows = tcp_rows()
    wanted = {str(i) for i in inodes}
    mine = [(local, remote, inode) for local, remote, _, inode in rows if inode in wanted]
    if not mine:
        return set()
    owners = {(local, remote): uid for local, remote, uid, _ in rows}
    me = str(os.getuid())
    out = set()
    for local, remote, inode in mine:
        uid = owners.get((remote, local))
        if uid is not None and uid != me:
            out.add(int(inode))
    return out
