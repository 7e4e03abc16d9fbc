"""``monarch.mesh_controller``: the tensor engine of a proc mesh, as in PyTorch Monarch.

``spawn_tensor_engine(proc_mesh)`` returns the proc mesh's :class:`DeviceMesh`
(workers are spawned on its procs the first time); ``proc_mesh.activate()`` is
the usual way in.  The engine itself is ``monarch/_tensor/``.
"""

from __future__ import annotations

from typing import Any

from monarch._tensor.controller import RemoteException
from monarch._tensor.mesh import DeviceMesh, device_mesh_of

__all__ = ["DeviceMesh", "RemoteException", "spawn_tensor_engine"]


def spawn_tensor_engine(proc_mesh: Any) -> DeviceMesh:
    """The tensor engine's device mesh over ``proc_mesh`` (one engine per proc mesh)."""
    return device_mesh_of(proc_mesh)
