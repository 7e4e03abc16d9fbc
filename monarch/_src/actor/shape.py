"""Compatibility only: Monarch's ``monarch._src.actor.shape``: ``NDSlice`` (its ``Slice``),
``ShapeExt.slice`` and the ``MeshTrait`` mixin, over the plain-Python ``Shape``/``Slice`` of
``monarch._rust_bindings.monarch_hyperactor.shape``.  monarch's own meshes don't use them (their
``slice``/``flatten``/``rename``/``split`` are ``monarch.actor``'s)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterator, Sequence, TypeVar

from monarch._rust_bindings.monarch_hyperactor.shape import Extent, Shape, Slice
from monarch.actor._shape import ValueMesh

__all__ = ["MeshTrait", "NDSlice", "Shape", "ShapeExt", "Slice", "iter_ranks"]

NDSlice = Slice
Slices = Slice | list[Slice]

_M = TypeVar("_M", bound="MeshTrait")


def iter_ranks(ranks: Slices) -> Iterator[int]:
    """The ranks of a slice, or of a list of slices once each, in order of first appearance."""
    if not isinstance(ranks, list):
        yield from ranks
        return
    seen: set[int] = set()
    for part in ranks:
        for rank in part:
            if rank not in seen:
                seen.add(rank)
                yield rank


class ShapeExt:
    """Cutting a ``Shape`` by several dimensions at once."""

    @staticmethod
    def slice(shape: Shape, **kwargs: Any) -> Shape:
        """``label=i`` keeps position ``i`` and drops the dimension; ``label=slice(...)`` keeps the
        dimension, cut: ``ShapeExt.slice(shape, host=0, gpu=slice(2, 6))``."""
        for label, sel in kwargs.items():
            if label not in shape.labels:
                raise TypeError(f"Shape does not have dimension labeled {label!r}")
            if isinstance(sel, slice):
                shape = shape.select(label, sel)
                continue
            if not 0 <= sel < shape.ndslice.sizes[shape.labels.index(label)]:
                raise IndexError("index out of range")
            shape = shape.at(label, sel)
        return shape


def _dense_strides(sizes: Sequence[int], inner: int = 1) -> list[int]:
    strides, acc = [], inner
    for size in reversed(sizes):
        strides.append(acc)
        acc *= size
    return strides[::-1]


class MeshTrait(ABC):
    """A mesh described by a labelled ``Slice``: a subclass gives ``_ndslice``, ``_labels`` and
    ``_new_with_shape`` and gets ``slice``, ``split``, ``flatten``, ``rename``, ``size``,
    ``sizes``, ``extent`` and ``len``."""

    @property
    @abstractmethod
    def _ndslice(self) -> Slice: ...

    @property
    @abstractmethod
    def _labels(self) -> tuple[str, ...]: ...

    @abstractmethod
    def _new_with_shape(self: _M, shape: Shape) -> _M: ...

    def slice(self: _M, **kwargs: Any) -> _M:
        """``mesh.slice(host=0, gpu=slice(2, 6))``: see ``ShapeExt.slice``."""
        return self._new_with_shape(ShapeExt.slice(Shape(list(self._labels), self._ndslice), **kwargs))

    def split(self: _M, **kwargs: Any) -> _M:
        """Split dimensions into several: ``mesh.split(host=("dp", "pp"), pp=4)``; a new dimension
        without a size given takes what is left (at most one per split dimension)."""
        splits: dict[str, Sequence[str]] = {}
        given: dict[str, int] = {}
        for key, value in kwargs.items():
            if key in self._labels:
                if isinstance(value, str):
                    raise ValueError(f"expected a sequence of dimensions, but got '{value}'")
                splits[key] = value
            elif isinstance(value, int):
                given[key] = value
            else:
                raise ValueError(f"'{key}' is not an existing dim. Expected an integer size constraint on a new dim.")
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        ndslice = self._ndslice
        for name, size, stride in zip(self._labels, ndslice.sizes, ndslice.strides):
            parts = list(splits.get(name, (name,)))
            unknown = [p for p in parts if p not in given]
            if len(unknown) > 1:
                raise ValueError(f"Cannot infer size of {tuple(parts)} because both {unknown[1]} and {unknown[0]} "
                                 f"have unknown size. Specify at least one as argument, e.g. {unknown[1]}=4")
            known = 1
            for p in parts:
                known *= given.get(p, 1)
            if unknown:
                if known == 0 or size % known:
                    shown = tuple(given.get(p, "?") for p in parts)
                    raise ValueError(f"Dimension '{name}' of size {size} is not evenly divided by {tuple(parts)!r} "
                                     f"with sizes {shown!r}")
                given[unknown[0]] = size // known
            elif known != size:
                raise ValueError(f"Dimension '{name}' of size {size} is not evenly divided by {tuple(parts)!r} "
                                 f"with sizes {tuple(given[p] for p in parts)!r}")
            part_sizes = [given.pop(p) for p in parts]
            for p in parts:
                if p in labels:
                    raise ValueError(f"Duplicate dimension name '{p}'")
            labels.extend(parts)
            sizes.extend(part_sizes)
            strides.extend(_dense_strides(part_sizes, stride))
        if given:
            raise ValueError(f"unused size constraints: {tuple(given)}")
        return self._new_with_shape(Shape(labels, Slice(offset=ndslice.offset, sizes=sizes, strides=strides)))

    def flatten(self: _M, name: str) -> _M:
        """All dimensions as one called ``name`` (a dense mesh only)."""
        ndslice = self._ndslice
        dense_strides = _dense_strides(ndslice.sizes)
        if dense_strides != ndslice.strides:
            raise ValueError(f"cannot flatten sparse mesh: {ndslice.strides=} != {dense_strides=}")
        return self._new_with_shape(Shape([name], Slice(offset=ndslice.offset, sizes=[len(ndslice)], strides=[1])))

    def rename(self: _M, **kwargs: str) -> _M:
        """``mesh.rename(host="dp")``: dimensions not named keep their names."""
        return self.split(**{old: (new,) for old, new in kwargs.items()})

    def size(self, dim: None | str | Sequence[str] = None) -> int:
        """How many members along ``dim`` (a label, several, or all when None)."""
        if dim is None:
            dim = self._labels
        if isinstance(dim, str):
            if dim not in self._labels:
                raise KeyError(f"{self} does not have dimension {dim!r}")
            return self._ndslice.sizes[self._labels.index(dim)]
        n = 1
        for d in dim:
            n *= self.size(d)
        return n

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self._labels, self._ndslice.sizes))

    @property
    def extent(self) -> Extent:
        return Extent(list(self._labels), self._ndslice.sizes)

    def __len__(self) -> int:
        return len(self._ndslice)


# monarch's ValueMesh is one, as Monarch's is (it gets the methods by calling these; monarch.actor
# cannot subclass this class: its module imports monarch.actor's Extent and Point).
MeshTrait.register(ValueMesh)
