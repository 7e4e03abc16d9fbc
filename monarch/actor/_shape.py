"""Shapes of meshes: ``Extent``, ``Point``, slicing, and ``ValueMesh``.

A mesh is a row-major grid of named dimensions over some underlying items
(procs or actors).  ``slice(gpus=1)`` drops the ``gpus`` dimension;
``slice(gpus=slice(0, 2))`` keeps it with two entries.
"""

from __future__ import annotations

import functools
import itertools
import pprint
from collections.abc import Mapping
from typing import Any, Generic, Iterator, Sequence, TypeVar

R = TypeVar("R")


class Extent(Mapping):
    """Named dimension sizes, e.g. ``{hosts: 2, gpus: 4}``."""

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]):
        self.labels = list(labels)
        self.sizes = list(sizes)

    @property
    def nelements(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def __getitem__(self, k: str) -> int:
        return self.sizes[self.labels.index(k)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}: {v}" for k, v in zip(self.labels, self.sizes)) + "}"

    def as_dict(self) -> dict:
        return dict(zip(self.labels, self.sizes))


class Point(Mapping):
    """A coordinate in an extent; ``point.rank`` is its row-major index."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, rank: int, extent: Extent):
        self.rank = rank
        self.extent = extent
        self._coords = _unravel(rank, extent.sizes)

    def __getitem__(self, k: str) -> int:
        return self._coords[self.extent.labels.index(k)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.extent.labels)

    def __len__(self) -> int:
        return len(self.extent.labels)

    def size(self, label: str) -> int:
        return self.extent[label]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self.rank == other.rank and self.extent.as_dict() == other.extent.as_dict()
        if isinstance(other, Mapping):
            return dict(self) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return "{" + ", ".join(f"'{k}': {c}/{s}" for k, c, s in zip(self.extent.labels, self._coords, self.extent.sizes)) + "}"


def _unravel(rank: int, sizes: Sequence[int]) -> list[int]:
    coords = []
    for s in reversed(sizes):
        coords.append(rank % s if s else 0)
        rank = rank // s if s else 0
    return list(reversed(coords))


class Shape:
    """Labels and sizes over a list of underlying indices (row-major)."""

    __slots__ = ("labels", "sizes", "indices", "_plan")

    def __init__(self, labels: Sequence[str], sizes: Sequence[int], indices: Sequence[int] | None = None):
        self.labels = tuple(labels)
        self.sizes = tuple(sizes)
        n = 1
        for s in self.sizes:
            n *= s
        self.indices = tuple(range(n)) if indices is None else tuple(indices)
        self._plan: tuple[dict, list[dict]] | None = None

    def __reduce__(self) -> tuple:
        return Shape, (self.labels, self.sizes, self.indices)  # not the plan: made again where needed

    def send_plan(self) -> tuple[dict, list[dict]]:
        """(extent, the point of each position) as a message to this shape carries them; made once
        per shape, as every call to a mesh sends them (read-only: copy before changing them)."""
        plan = getattr(self, "_plan", None)
        if plan is None:
            labels = self.labels
            points = [dict(zip(labels, _unravel(i, self.sizes))) if labels else {} for i in range(len(self.indices))]
            plan = self._plan = (dict(zip(labels, self.sizes)), points)
        return plan

    @property
    def extent(self) -> Extent:
        return Extent(self.labels, self.sizes)

    def __len__(self) -> int:
        return len(self.indices)

    def slice(self, **dims: Any) -> "Shape":
        for k in dims:
            if k not in self.labels:
                raise TypeError(f"Shape does not have dimension labeled {k!r}")
        ranges = []
        labels, sizes = [], []
        for label, size in zip(self.labels, self.sizes):
            sel = dims.get(label)
            if sel is None:
                ranges.append(range(size))
                labels.append(label)
                sizes.append(size)
            elif isinstance(sel, int):
                i = sel + size if sel < 0 else sel
                if not 0 <= i < size:
                    raise IndexError("index out of range")
                ranges.append(range(i, i + 1))
            elif isinstance(sel, slice):
                r = range(size)[sel]
                if len(r) == 0:
                    raise IndexError("empty slice")
                ranges.append(r)
                labels.append(label)
                sizes.append(len(r))
            else:
                raise TypeError(f"slice({label}=...) takes an int or a slice, not {type(sel).__name__}")
        strides = _strides(self.sizes)
        indices = [self.indices[sum(c * s for c, s in zip(coord, strides))] for coord in itertools.product(*ranges)]
        return Shape(labels, sizes, indices)

    def flatten(self, name: str) -> "Shape":
        """All dimensions as one called ``name``, in row-major order."""
        return Shape((name,), (len(self.indices),), self.indices)

    def point(self, i: int) -> dict:
        return dict(zip(self.labels, _unravel(i, self.sizes)))

    def __repr__(self) -> str:
        return repr(self.extent)


def _strides(sizes: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= s
    return list(reversed(strides))


def _nd() -> Any:
    # Monarch's Shape/Slice and MeshTrait import this module's Extent and Point: imported when used.
    from monarch._rust_bindings.monarch_hyperactor import shape

    return shape


@functools.lru_cache(maxsize=256)
def _row_major(labels: tuple[str, ...], sizes: tuple[int, ...]) -> Any:
    """Monarch's dense Shape over ``sizes``.  Every ``call()`` of a mesh makes a ValueMesh of the
    mesh's shape: made once per shape (it is immutable) rather than checked anew each time."""
    nd = _nd()
    # Monarch's new_row_major refuses no dimensions: a 0-d mesh (one point) is the empty slice.
    dense = nd.Slice.new_row_major(list(sizes)) if sizes else nd.Slice(offset=0, sizes=[], strides=[])
    return nd.Shape(list(labels), dense)


def _trait() -> Any:
    from monarch._src.actor.shape import MeshTrait

    return MeshTrait


class ValueMesh(Generic[R]):
    """The answers of a whole mesh, one per point.

    As Monarch's, a ``MeshTrait`` (registered there): its ``_shape`` is Monarch's labelled
    ``Slice`` (``monarch._rust_bindings.monarch_hyperactor.shape.Shape``) whose ranks are in the
    order of the values; ``slice``, ``split``, ``rename`` and ``flatten`` keep each value with its
    rank.  ``ValueMesh(shape, values)`` also takes a monarch mesh's shape (values row-major)."""

    __slots__ = ("_shape", "_values")

    def __init__(self, shape: Any, values: list[R]):
        if not isinstance(shape, _nd().Shape):
            shape = _row_major(tuple(shape.labels), tuple(shape.sizes))
        values = list(values)
        if len(values) != len(shape):
            raise ValueError(f"ValueMesh of {len(shape)} ranks given {len(values)} values")
        self._shape = shape
        self._values = values

    # ``ValueMesh[int]`` is ValueMesh itself at runtime, as Monarch's (a class its runtime makes).
    def __class_getitem__(cls, item: Any) -> Any:
        return cls

    @staticmethod
    def from_indexed(shape: Any, pairs: Any) -> "ValueMesh":
        """A ValueMesh from ``(position, value)`` pairs: the last pair for a position wins, and every
        position must have one."""
        n = len(shape)
        values: dict[int, Any] = {}
        for i, v in pairs:
            if not 0 <= i < n:
                raise ValueError(f"index {i} out of range for a mesh of {n}")
            values[i] = v
        if len(values) != n:
            raise ValueError(f"from_indexed: expected {n} values, but the pairs contains {len(values)} distinct ranks")
        return ValueMesh(shape, [values[i] for i in range(n)])

    @property
    def _ndslice(self) -> Any:
        return self._shape.ndslice

    @property
    def _labels(self) -> tuple[str, ...]:
        return tuple(self._shape.labels)

    def _new_with_shape(self, shape: Any) -> "ValueMesh[R]":
        pos = {rank: i for i, rank in enumerate(self._shape.ndslice)}
        return ValueMesh(shape, [self._values[pos[rank]] for rank in shape.ndslice])

    def get(self, rank: int) -> R:
        """The value at position ``rank`` (0 .. len-1) of the mesh's row-major order."""
        if not 0 <= rank < len(self._values):
            raise ValueError(f"index {rank} out of range for a mesh of {len(self._values)}")
        return self._values[rank]

    @property
    def extent(self) -> Extent:
        return Extent(self._shape.labels, self._shape.ndslice.sizes)

    @property
    def sizes(self) -> dict[str, int]:
        """Each dimension's label and size, in order."""
        return dict(zip(self._shape.labels, self._shape.ndslice.sizes))

    def slice(self, **dims: Any) -> "ValueMesh[R]":
        """The values at a part of the mesh, as for ``ActorMesh.slice``: ``vm.slice(gpus=0)``."""
        return _trait().slice(self, **dims)

    def split(self, **dims: Any) -> "ValueMesh[R]":
        """Dimensions split in several, row-major: ``vm.split(gpus=("pairs", "two"), two=2)``."""
        return _trait().split(self, **dims)

    def rename(self, **names: str) -> "ValueMesh[R]":
        """The same values with dimensions renamed: ``vm.rename(gpus="g")``."""
        return _trait().rename(self, **names)

    def item(self, **coords: int) -> R:
        """The value at ``coords`` (every dimension named)."""
        labels = self._shape.labels
        extra = set(coords) - set(labels)
        if extra:
            raise KeyError(f"unknown dimension(s) {sorted(extra)}; this mesh has {list(labels)}")
        missing = [k for k in labels if k not in coords]
        if missing:
            raise KeyError(f"item() needs every dimension; missing {missing}")
        i = 0
        for label, size in zip(labels, self._shape.ndslice.sizes):
            c = coords[label]
            if not 0 <= c < size:
                raise IndexError(f"{label}={c} out of range 0..{size - 1}")
            i = i * size + c
        return self._values[i]

    def items(self) -> Iterator[tuple[Point, R]]:
        ext = self.extent
        for i, v in enumerate(self._values):
            yield Point(i, ext), v

    __iter__ = items

    def values(self) -> list[R]:
        return list(self._values)

    def flatten(self, name: str) -> "ValueMesh[R]":
        """The same values along one dimension called ``name``: ``vm.flatten("rank")`` (a dense
        mesh's: one sliced with a step is refused, as Monarch's is)."""
        return _trait().flatten(self, name)

    def size(self, dim: Any = None) -> int:
        """How many values: all of them, or along ``dim`` (a label, or several)."""
        return len(self._values) if dim is None else _trait().size(self, dim)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ValueMesh) and self._shape.ndslice.sizes == other._shape.ndslice.sizes
                and self._values == other._values)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return ValueMesh, (self._shape, self._values)

    def __repr__(self) -> str:
        body = pprint.pformat(tuple(self.items()))
        return f"ValueMesh({self.extent}):\n  " + body.replace("\n", "\n  ")
