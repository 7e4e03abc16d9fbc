"""Compatibility only: Monarch's native ``ProcMesh`` (what ``ProcMesh._proc_mesh`` resolves to),
monarch's record of a proc mesh's procs and region."""

from monarch.actor._mesh import HyProcMesh as ProcMesh  # noqa: F401
