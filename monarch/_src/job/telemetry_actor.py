"""Compatibility: Monarch's ``monarch._src.job.telemetry_actor``.

Monarch collects a job's telemetry in a sidecar: a ``TelemetryActor`` per host reads the rows its procs
write to a local socket, and the root one answers SQL.  monarch's host agents record and keep a job's
rows themselves and the job's telemetry service asks them (README 'Telemetry'): no job starts a
``TelemetryActor``.  One a program makes and activates is a real collector, though: it serves the
socket where Monarch puts it (a 0700 folder of the user's, the socket 0600, only the user's own
processes heard) and keeps the rows written to it, in Monarch's frames (a table name and one Arrow IPC
stream each), in tables of its own (``_scanner``).  Monarch's worker-collector tree is not here.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import tempfile
import threading
from typing import Any

from monarch.actor import Actor, current_rank, endpoint  # noqa: F401  (Monarch's module exports current_rank)
from monarch_agents.debug_rank import recv_exact
from monarch_agents.files import UnsafeFolder, private_dir

#: How long a job's telemetry query waits for each host's scan (Monarch's: for each worker collector's);
#: a host that has not answered by then is left out of the answer, as Monarch leaves out a worker that
#: timed out.  Read at each query of the job's telemetry service (``monarch._workbench.job_services``).
_SCAN_WORKER_TIMEOUT_SECS = 10.0

log = logging.getLogger("monarch.telemetry")

_WHERE = ("monarch has no telemetry actor: its host agents keep the job's tables; query them with "
          "state.query_engine_client (README 'Telemetry')")


def telemetry_socket_dir(apply_id: str) -> str:
    """The folder of ``apply_id``'s collector socket (under this user's temp folder)."""
    return os.path.join(tempfile.gettempdir(), f"monarch-telemetry-{os.getuid()}", apply_id)


def telemetry_socket_path(apply_id: str) -> str:
    return os.path.join(telemetry_socket_dir(apply_id), "telemetry.sock")


#: A frame's payload at most (Monarch's bound): a bigger length ends the connection.
_MAX_FRAME = 16 << 20


def _start_socket_ingest(scanner: Any, socket_path: str) -> socket.socket:
    """Serve ``socket_path``: each frame a connection sends (u16 big-endian name length, the table's
    name, u32 big-endian payload length, one Arrow IPC stream) adds its rows to ``scanner``'s table of
    that name (Monarch's six event tables go to ours, ``<name>_ext``).  Raises RuntimeError when a live
    collector answers there already; a stale socket file is replaced."""
    if os.path.exists(socket_path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(socket_path)
        except OSError:
            os.unlink(socket_path)  # nobody listens: a collector that died left it
        else:
            raise RuntimeError("telemetry socket already has a live collector")
        finally:
            probe.close()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(socket_path)  # 0600 from birth, in the 0700 folder
    finally:
        os.umask(old)
    server.listen(16)
    threading.Thread(target=_accept, args=(server, scanner), name="telemetry-ingest", daemon=True).start()
    return server


def _accept(server: socket.socket, scanner: Any) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # closed: the collector stopped
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():
            conn.close()  # another user's process: its rows are not this user's telemetry
            continue
        threading.Thread(target=_ingest, args=(conn, scanner), name="telemetry-ingest-conn", daemon=True).start()


def _signed(t: Any) -> Any:
    """Monarch's unsigned 64-bit ids as our signed ones, bit for bit (an id past 2**63 is negative
    here, the same in every table, so joins still match)."""
    import pyarrow as pa

    for i, f in enumerate(t.schema):
        if pa.types.is_unsigned_integer(f.type):
            t = t.set_column(i, f.name, t.column(i).cast(pa.int64(), safe=False))
    return t


def _ingest(conn: socket.socket, scanner: Any) -> None:
    from monarch_telemetry.schema import TABLES
    from monarch_telemetry.table import from_ipc

    with conn:
        while True:
            head = recv_exact(conn, 2)
            if head is None:
                return
            name_b = recv_exact(conn, struct.unpack(">H", head)[0])
            size_b = recv_exact(conn, 4)
            if name_b is None or size_b is None:
                return
            size = struct.unpack(">I", size_b)[0]
            if not 0 < size <= _MAX_FRAME:
                log.warning("telemetry collector: a frame of %d bytes, connection closed", size)
                return
            payload = recv_exact(conn, size)
            if payload is None:
                return
            name = name_b.decode(errors="replace")
            spec = TABLES.get(name)
            table = scanner.tables.get(spec.source or name) if spec is not None else None
            if table is None:
                continue  # a table this collector does not keep (Monarch's traces, snapshots)
            try:
                table.append_batch(_signed(from_ipc(payload)))
            except Exception as e:  # a frame that is no Arrow stream of that table: dropped, the rest kept
                log.warning("telemetry collector: a frame of %s dropped: %s", name, e)


class TelemetryActor(Actor):
    """Monarch's per-host telemetry collector: activated, it keeps the rows written to its socket
    (see the module docstring); no job of monarch starts one."""

    def __init__(self, apply_id: str, retention_secs: int) -> None:
        self._apply_id = apply_id
        self._retention_secs = retention_secs
        self._scanner: Any = None
        self._server: socket.socket | None = None
        self._worker_collectors: list[Any] = []

    def _scanner_or_raise(self) -> Any:
        if self._scanner is None:
            raise RuntimeError(f"this TelemetryActor is not an active telemetry collector: {_WHERE}")
        return self._scanner

    def _activate_impl(self) -> bool:
        """Serve this collector's socket (once); False, with a warning logged, when it cannot."""
        if self._scanner is not None:
            return True
        from monarch_telemetry.table import Store

        socket_dir = telemetry_socket_dir(self._apply_id)
        try:
            # Both folders under the shared temp folder: made 0700, or found and checked as the user's.
            private_dir(socket_dir, top=os.path.dirname(socket_dir))
        except (UnsafeFolder, OSError) as e:
            log.warning("telemetry collector activation failed: %s", e)
            return False
        scanner = Store()
        if self._retention_secs and self._retention_secs > 0:
            scanner.retain(self._retention_secs)
        try:
            self._server = _start_socket_ingest(scanner, telemetry_socket_path(self._apply_id))
        except Exception as e:
            log.warning("telemetry collector activation failed: %s", e)
            return False
        self._scanner = scanner
        return True

    @endpoint
    def activate(self) -> bool:
        """Serve the collector's socket; whether it is served."""
        return self._activate_impl()

    def close(self) -> None:
        """Stop serving the socket (its rows stay in ``_scanner``)."""
        server, self._server = self._server, None
        if server is not None:
            path = server.getsockname()
            try:
                server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
            except OSError:
                pass
            server.close()
            if isinstance(path, str) and os.path.exists(path):
                os.unlink(path)

    def __cleanup__(self, exc: Any = None) -> None:
        self.close()

    def _start_worker_collector(self, host_mesh: Any, actor_class: type, apply_id: str, name: str) -> Any:
        raise NotImplementedError(_WHERE)
