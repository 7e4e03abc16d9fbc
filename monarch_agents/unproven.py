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
import socket
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


def _proc_net_addr(host: str, port: int) -> str:
    """``host:port`` as ``/proc/net/tcp[6]`` writes it (each 32-bit word of the address in host order)."""
    import ipaddress
    import sys

    raw = ipaddress.ip_address(host.split("%")[0]).packed
    words = [raw[i:i + 4] for i in range(0, len(raw), 4)]
    return "".join((w[::-1] if sys.byteorder == "little" else w).hex().upper() for w in words) + f":{port:04X}"


def local_peer_uid(conn: socket.socket) -> int | None:
    """The uid that owns the other end of ``conn`` when that end is a socket of this machine (the
    kernel's own table, ``/proc/net/tcp[6]``); None for a peer elsewhere, or where it cannot be told."""
    try:
        peer, me = conn.getpeername()[:2], conn.getsockname()[:2]
        theirs, ours = _proc_net_addr(*peer), _proc_net_addr(*me)
        table = "/proc/net/tcp6" if conn.family == socket.AF_INET6 else "/proc/net/tcp"
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[1] == theirs and cols[2] == ours:
                    return int(cols[7])
    except (OSError, ValueError, StopIteration):
        pass
    return None
