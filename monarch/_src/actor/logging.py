"""Compatibility only: Monarch's ``monarch._src.actor.logging`` names, over monarch's log forwarding.

Monarch's ``LoggingManager`` drives a native ``LoggingMeshClient`` spawned on a proc mesh; here the
``LoggingMeshClient`` is a thin handle on the mesh's own ``ProcMesh._logging_manager``
(``monarch.actor._logging``), which forwards the procs' output to this client.  Monarch flushes every
live mesh's logs after each IPython cell (``flush_all_proc_mesh_logs``); so does this module once a
mesh's ``logging_option`` ran inside IPython.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import Any, Optional, Tuple

from monarch.actor import context

log = logging.getLogger("monarch.actor")

#: Whether this process runs inside IPython (a notebook or the IPython shell).
IN_IPYTHON = "IPython" in sys.modules and getattr(sys.modules["IPython"], "get_ipython", lambda: None)() is not None

_global_flush_registered = False
_global_flush_lock = threading.Lock()
#: Flushes scheduled on a running loop, held so that they are not collected before they run.
_pending_flush_tasks: set = set()


def flush_all_proc_mesh_logs() -> None:
    """Print what every unstopped proc mesh of this process has written so far (best effort)."""
    from monarch._src.actor import proc_mesh

    for mesh in proc_mesh.get_active_proc_meshes():
        mesh._logging_manager.flush()


async def _flush_all_proc_mesh_logs_async() -> None:
    await asyncio.get_running_loop().run_in_executor(None, flush_all_proc_mesh_logs)


def _rust_instance() -> Any:
    # Monarch hands its native client the caller's native instance; ours takes the instance itself.
    instance = context().actor_instance
    as_rust = getattr(instance, "_as_rust", None)
    return as_rust() if callable(as_rust) else instance


class LoggingMeshClient:
    """A proc mesh's log forwarding, as Monarch's native client is driven (``set_mode``, ``flush``)."""

    def __init__(self, proc_mesh: Any) -> None:
        self._proc_mesh = proc_mesh

    @classmethod
    async def spawn(cls, instance: Any, proc_mesh: Any) -> "LoggingMeshClient":
        return cls(_owning_proc_mesh(proc_mesh))

    def set_mode(self, instance: Any, *, stream_to_client: bool, aggregate_window_sec: int | None,
                 level: int) -> None:
        self._proc_mesh._logging_manager.set_mode(stream_to_client, aggregate_window_sec, level)

    def flush(self, instance: Any) -> None:
        self._proc_mesh._logging_manager.flush()


def _owning_proc_mesh(proc_mesh: Any) -> Any:
    """``proc_mesh`` itself, or for Monarch's native ``HyProcMesh`` the ProcMesh that holds its procs."""
    if hasattr(proc_mesh, "_logging_manager"):
        return proc_mesh
    from monarch._src.actor import proc_mesh as pm_module

    for pm in pm_module.get_active_proc_meshes():
        if pm._procs is getattr(proc_mesh, "_procs", None):
            return pm
    raise ValueError(f"{proc_mesh!r} is not a proc mesh this process spawned")


class LoggingManager:
    """One proc mesh's log streaming to this client (Monarch's shape; see the module docstring)."""

    def __init__(self) -> None:
        self._logging_mesh_client: Optional[LoggingMeshClient] = None

    async def init(self, proc_mesh: Any, stream_to_client: bool) -> None:
        if self._logging_mesh_client is not None:
            return
        instance = _rust_instance()
        self._logging_mesh_client = await LoggingMeshClient.spawn(instance, proc_mesh=proc_mesh)
        # Monarch starts streaming meshes with 3 s windows; a window without streaming is refused here.
        self._logging_mesh_client.set_mode(instance, stream_to_client=stream_to_client,
                                           aggregate_window_sec=3 if stream_to_client else None, level=logging.INFO)

    def register_flusher_if_in_ipython(self) -> None:
        """Inside IPython, flush every mesh's logs after each cell (once per process)."""
        global _global_flush_registered
        if not IN_IPYTHON:
            return
        with _global_flush_lock:
            if _global_flush_registered:
                return
            import IPython

            def _post_run_cell_flush(_: object) -> None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    flush_all_proc_mesh_logs()
                    return
                # A cell run by an async kernel: blocking here would stall its loop.
                task = loop.create_task(_flush_all_proc_mesh_logs_async())
                _pending_flush_tasks.add(task)
                task.add_done_callback(_pending_flush_tasks.discard)

            IPython.get_ipython().events.register("post_run_cell", _post_run_cell_flush)
            _global_flush_registered = True

    def enable_fd_capture_if_in_ipython(self) -> Optional[Tuple[int, int]]:
        """None: monarch prints the procs' lines with the client's ``sys.stdout``/``sys.stderr``, which a
        notebook already shows, so no file descriptor is captured (Monarch's returns the fds it captured)."""
        return None

    async def logging_option(self, stream_to_client: bool = True, aggregate_window_sec: int | None = 3,
                             level: int = logging.INFO) -> None:
        if self._logging_mesh_client is None:
            raise RuntimeError("LoggingManager.logging_option before init(proc_mesh, ...)")
        self._logging_mesh_client.set_mode(_rust_instance(), stream_to_client=stream_to_client,
                                           aggregate_window_sec=aggregate_window_sec, level=level)
        self.register_flusher_if_in_ipython()
        self.enable_fd_capture_if_in_ipython()

    def flush(self) -> None:
        client = self._logging_mesh_client
        if client is None:
            return
        try:
            client.flush(_rust_instance())
        except Exception as e:  # noqa: BLE001 - a flush is best effort, as Monarch's: it never fails its caller
            log.debug("flushing proc logs: %s", e)

    async def flush_async(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.flush)
