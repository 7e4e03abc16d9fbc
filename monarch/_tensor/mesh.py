"""Device meshes: a proc mesh seen by the tensor engine, and which one is active.

``proc_mesh.activate()`` makes the proc mesh's device mesh active: torch ops
issued inside the block (factories like ``torch.rand`` included) run on every
proc of it and return remote tensors.  ``no_mesh.activate()`` runs ops locally
again inside such a block.  A mesh can be sliced like a proc mesh
(``mesh.slice(gpus=0)``); ops under a slice run only on its procs.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from monarch.actor._shape import Shape
from monarch._tensor.controller import Controller

_local = threading.local()


class DeviceMesh:
    """The procs of a proc mesh as the tensor engine addresses them: named dims over proc indices."""

    def __init__(self, client: Controller, shape: Shape):
        self.client = client
        self._shape = shape
        self.names = tuple(shape.labels)
        self.ranks_tuple = tuple(shape.indices)
        # Every proc of the engine, in order: ops say so with None (nothing for workers to look up).
        self.op_ranks = None if self.ranks_tuple == tuple(range(client.n)) else frozenset(self.ranks_tuple)

    # -- shape -------------------------------------------------------------------------------

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self._shape.labels, self._shape.sizes))

    def size(self, dim: str | tuple | None = None) -> int:
        if dim is None:
            return len(self._shape)
        if isinstance(dim, str):
            return self.sizes[dim]
        n = 1
        for d in dim:
            n *= self.sizes[d]
        return n

    def __len__(self) -> int:
        return len(self._shape)

    @property
    def _labels(self) -> tuple[str, ...]:
        return self.names

    def slice(self, **dims: Any) -> "DeviceMesh":
        """The procs at the given coordinates (an int drops the dim, a slice keeps it)."""
        return mesh_for(self.client, self._shape.slice(**dims))

    def _process(self, shard: dict | None) -> int:
        """The proc index at ``shard``'s coordinates (missing dims: 0)."""
        shard = dict(shard or {})
        extra = set(shard) - set(self.names)
        if extra:
            raise KeyError(f"{sorted(extra)} are not dims of {self!r}")
        flat = 0
        for name, size in zip(self._shape.labels, self._shape.sizes):
            c = shard.get(name, 0)
            if not 0 <= c < size:
                raise IndexError(f"{name}={c} is outside {self!r}")
            flat = flat * size + c
        return self.ranks_tuple[flat]

    def coordinates(self) -> list[dict[str, int]]:
        """Each proc's coordinates, in the mesh's row-major order."""
        out = []
        for i in range(len(self._shape)):
            r, c = i, {}
            for name, size in reversed(list(zip(self._shape.labels, self._shape.sizes))):
                c[name] = r % size
                r //= size
            out.append(c)
        return out

    # -- use -----------------------------------------------------------------------------------

    def activate(self) -> contextlib.AbstractContextManager:
        """Inside the block, torch ops run on this mesh's procs."""
        return _activate(self)

    def rank(self, dims: str | tuple | list) -> Any:
        """A remote 0-d long tensor: each proc's coordinate along ``dims`` (row-major for several)."""
        from monarch._tensor.tensor import call_remote

        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        for d in dims:
            if d not in self.names:
                raise KeyError(f"{self!r} does not have dimension {d!r}")
        sizes = self.sizes
        table = {}
        for rank, c in zip(self.ranks_tuple, self.coordinates()):
            v = 0
            for d in dims:
                v = v * sizes[d] + c[d]
            table[rank] = v
        import torch

        from monarch._tensor.worker import MyRank

        meta = torch.empty((), dtype=torch.long, device="meta")
        return call_remote(self, "monarch._tensor.worker.rank_value", (table, MyRank()), {}, meta)

    @property
    def ranks(self) -> dict[str, Any]:
        return {d: self.rank(d) for d in self.names}

    def exit(self) -> None:
        """End this tensor engine, as the mesh Monarch's ``spawn_tensor_engine`` returns does: what
        was issued is sent, then the engine's workers stop (behind it, in each one's order) and the
        procs stay; later ops on this mesh (or a slice of it) raise; ``spawn_tensor_engine`` or
        ``activate()`` on the proc mesh starts a new engine.  Again: nothing."""
        ctl = self.client
        with _engines_lock:
            for mid, c in list(_engines.items()):
                if c is ctl:
                    del _engines[mid]
        if ctl._stopped:
            return
        if ctl.failed is None:
            ctl.flush()
        ctl.stop()
        with contextlib.suppress(Exception):  # a proc already gone has no worker left to stop
            ctl.workers.stop().get()

    def __repr__(self) -> str:
        return f"DeviceMesh({self._shape.extent}, procs={list(self.ranks_tuple)})"


def mesh_for(client: Controller, shape: Shape) -> DeviceMesh:
    """The one DeviceMesh object for ``shape`` of ``client`` (tensors check meshes by identity)."""
    key = (shape.labels, shape.sizes, tuple(shape.indices))
    meshes = client.__dict__.setdefault("meshes", {})
    m = meshes.get(key)
    if m is None:
        m = meshes[key] = DeviceMesh(client, shape)
    return m


def get_active_mesh() -> DeviceMesh:
    m = active()
    if m is None:
        raise ValueError("no device mesh is active")
    return m


def active() -> DeviceMesh | None:
    return getattr(_local, "mesh", None)


@contextlib.contextmanager
def _activate(mesh: DeviceMesh | None) -> Iterator[None]:
    from monarch._tensor.tensor import dispatch_mode

    old = active()
    _local.mesh = mesh
    try:
        with dispatch_mode():
            yield
    finally:
        _local.mesh = old


class _NoMesh:
    """``with no_mesh.activate():`` ops run locally, even inside an active mesh's block."""

    def activate(self) -> contextlib.AbstractContextManager:
        return _activate(None)

    def __repr__(self) -> str:
        return "no_mesh"


no_mesh = _NoMesh()


# --- one engine per proc mesh -------------------------------------------------------------------

_engines: dict[str, Controller] = {}
_engines_lock = threading.Lock()


def device_mesh_of(proc_mesh: Any) -> DeviceMesh:
    """The tensor engine's view of ``proc_mesh`` (its workers are spawned on first use)."""
    mid = proc_mesh._mesh_id
    with _engines_lock:
        ctl = _engines.get(mid)
        if ctl is None or ctl.failed is not None and ctl._stopped:
            ctl = _engines[mid] = Controller(proc_mesh)
    return mesh_for(ctl, proc_mesh._shape)


def forget(proc_mesh: Any) -> None:
    """The proc mesh was stopped: its engine goes too."""
    with _engines_lock:
        ctl = _engines.pop(proc_mesh._mesh_id, None)
    if ctl is not None:
        ctl.stop()
