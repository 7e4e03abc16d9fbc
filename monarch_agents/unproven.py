"""A cap on the connections a listener holds before they show who they are.

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
