"""Compatibility only: Monarch's ``monarch._src.job.telemetry_actor`` names.

Monarch collects a job's telemetry in a sidecar: a ``TelemetryActor`` per host reads the rows its procs
write to a local socket, and the root one answers SQL.  monarch's host agents record and keep those rows
themselves and the job's telemetry service asks them (README 'Telemetry'), so no actor collects here.
The names exist so that programs which import or subclass them load; the socket paths are where Monarch
puts them, private to the user (0700).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from monarch.actor import Actor, current_rank  # noqa: F401  (Monarch's module exports current_rank)

#: How long a job's telemetry query waits for each host's scan (Monarch's: for each worker collector's);
#: a host that has not answered by then is left out of the answer, as Monarch leaves out a worker that
#: timed out.  Read at each query of the job's telemetry service (``monarch._workbench.job_services``).
_SCAN_WORKER_TIMEOUT_SECS = 10.0

_WHERE = ("monarch has no telemetry actor: its host agents keep the job's tables; query them with "
          "state.query_engine_client (README 'Telemetry')")


def telemetry_socket_dir(apply_id: str) -> str:
    """The folder of ``apply_id``'s collector socket (under this user's temp folder)."""
    return os.path.join(tempfile.gettempdir(), f"monarch-telemetry-{os.getuid()}", apply_id)


def telemetry_socket_path(apply_id: str) -> str:
    return os.path.join(telemetry_socket_dir(apply_id), "telemetry.sock")


class TelemetryActor(Actor):
    """Monarch's per-host telemetry collector; under monarch it collects nothing (see the module docstring)."""

    def __init__(self, apply_id: str, retention_secs: int) -> None:
        self._apply_id = apply_id
        self._retention_secs = retention_secs
        self._scanner: Any = None
        self._worker_collectors: list[Any] = []

    def _scanner_or_raise(self) -> Any:
        if self._scanner is None:
            raise RuntimeError(f"this TelemetryActor is not an active telemetry collector: {_WHERE}")
        return self._scanner

    def _activate_impl(self) -> bool:
        return False

    def _start_worker_collector(self, host_mesh: Any, actor_class: type, apply_id: str, name: str) -> Any:
        raise NotImplementedError(_WHERE)
