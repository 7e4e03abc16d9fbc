"""Shapes of meshes: ``Extent``, ``Point``, slicing, and ``ValueMesh``.

A mesh is a row-major grid of named dimensions over some underlying items
(procs or actors).  ``slice(gpus=1)`` drops the ``gpus`` dimension;
``slice(gpus=slice(0, 2))`` keeps it with two entries.
"""

from __future__ import annotations

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


class ValueMesh(Generic[R]):
    """The answers of a whole mesh, one per point."""

    def __init__(self, shape: Shape, values: list[R]):
        self._shape = Shape(shape.labels, shape.sizes)
        self._values = list(values)

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    def item(self, **coords: int) -> R:
        """The value at ``coords`` (every dimension named)."""
        extra = set(coords) - set(self._shape.labels)
        if extra:
            raise KeyError(f"unknown dimension(s) {sorted(extra)}; this mesh has {list(self._shape.labels)}")
        missing = [k for k in self._shape.labels if k not in coords]
        if missing:
            raise KeyError(f"item() needs every dimension; missing {missing}")
        i = 0
        for label, size in zip(self._shape.labels, self._shape.sizes):
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

    def slice(self, **dims: Any) -> "ValueMesh[R]":
        """The values at a part of the mesh, as for ``ActorMesh.slice``: ``vm.slice(gpus=0)``."""
        sub = self._shape.slice(**dims)
        return ValueMesh(Shape(sub.labels, sub.sizes), [self._values[i] for i in sub.indices])

    def flatten(self, name: str) -> "ValueMesh[R]":
        """The same values along one dimension called ``name``: ``vm.flatten("rank")``."""
        return ValueMesh(Shape((name,), (len(self._values),)), self._values)

    @property
    def sizes(self) -> dict:
        return dict(zip(self._shape.labels, self._shape.sizes))

    def size(self, dim: str | None = None) -> int:
        return len(self._values) if dim is None else self.sizes[dim]

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueMesh) and self._shape.sizes == other._shape.sizes and self._values == other._values

    def __repr__(self) -> str:
        body = pprint.pformat(tuple((dict(p), v) for p, v in self.items()) if False else tuple(self.items()))
        return f"ValueMesh({self.extent}):\n  " + body.replace("\n", "\n  ")
