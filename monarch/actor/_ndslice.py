"""A mesh's shape as Monarch's runtime describes it: labels over a strided ``Slice`` of the hosts or
procs the mesh was cut from (a ``Region``), and back.

A mesh of monarch keeps its members as a list and its shape as the indices of that list it covers
(``monarch.actor._shape.Shape``); these convert that to Monarch's ``Region`` (the classes of
``monarch._rust_bindings.monarch_hyperactor.shape``) so that a program can read ``mesh.region``,
``mesh._ndslice`` and cut a mesh with ``mesh._new_with_shape(Shape(labels, Slice(...)))``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from monarch.actor._shape import Shape as MeshShape, _strides

if TYPE_CHECKING:
    from monarch._rust_bindings.monarch_hyperactor.shape import Region, Shape, Slice

# The shape classes are imported when first used: their module imports monarch.actor's Extent and
# Point, and monarch.actor's meshes import this one.


def _classes() -> Any:
    from monarch._rust_bindings.monarch_hyperactor import shape

    return shape


def _slice_of(sizes: Sequence[int], indices: Sequence[int]) -> "Slice":
    """The slice that lists ``indices`` row-major over ``sizes``; ``ValueError`` if they are not a
    strided grid (a flattened slice of a slice, say)."""
    Slice = _classes().Slice
    sizes = list(sizes)
    unit = _strides(sizes)
    if not indices:
        return Slice(offset=0, sizes=sizes, strides=unit)
    # A dimension of size 1 has no step to measure: it gets its row-major stride.
    strides = [indices[u] - indices[0] if n > 1 else u for n, u in zip(sizes, unit)]
    if any(s < 0 for s in strides):
        raise ValueError(f"ranks {list(indices)} are not a strided slice")
    s = Slice(offset=indices[0], sizes=sizes, strides=strides)
    if list(s) != list(indices):
        raise ValueError(f"ranks {list(indices)} are not a strided slice")
    return s


def region_of(shape: MeshShape) -> "Region":
    """The region a mesh's shape covers of its base (the mesh's list of members)."""
    return _classes().Region(list(shape.labels), _slice_of(shape.sizes, shape.indices))


def as_mesh_shape(shape: "MeshShape | Shape") -> MeshShape:
    """A monarch mesh shape as it is; Monarch's ``Shape`` (labels over a slice) converted."""
    return shape if isinstance(shape, MeshShape) else mesh_shape(shape)


def mesh_shape(shape: "Shape | Region") -> MeshShape:
    """The same ranks as a monarch mesh shape (labels, sizes, indices of the base)."""
    region: Region = shape.region if isinstance(shape, _classes().Shape) else shape  # type: ignore[assignment]
    s = region.slice()
    return MeshShape(region.labels, s.sizes, list(s))
