"""Compatibility only: Monarch's ``monarch._src.actor.proc_mesh`` names, aliases of ``monarch.actor``'s,
and its proc-mesh spawn callbacks (which Monarch's tests use)."""

from typing import Callable

from monarch.actor import ProcMesh, _mesh, get_or_spawn_controller  # noqa: F401
from monarch.actor._mesh import HyProcMesh  # noqa: F401


def register_proc_mesh_spawn_callback(callback: Callable[[ProcMesh], None]) -> None:
    """Call ``callback(proc_mesh)`` with every proc mesh ``spawn_procs`` returns in this process from now on."""
    _mesh._spawn_callbacks.append(callback)


def unregister_proc_mesh_spawn_callback(callback: Callable[[ProcMesh], None]) -> None:
    """Stop calling ``callback``; one that is not registered is ignored."""
    if callback in _mesh._spawn_callbacks:
        _mesh._spawn_callbacks.remove(callback)


def get_active_proc_meshes() -> list[ProcMesh]:
    """The proc meshes this process spawned that are not stopped (Monarch flushes their logs after each
    IPython cell with ``monarch._src.actor.logging.flush_all_proc_mesh_logs``)."""
    return [pm for pm in list(_mesh._spawned_proc_meshes) if not pm._stopped]
