"""The plain-Python Slice, Shape and Region that Monarch's
``monarch._rust_bindings.monarch_hyperactor.shape`` names.

Monarch's meshes are described by a ``Slice`` (an offset, sizes and strides over a flat list of
ranks) with a label per dimension (``Shape``, ``Region``); its tests and some programs build and
cut them directly.  These are plain-Python versions with the same constructors, properties and
errors (``ValueError`` with the same texts, ``OverflowError`` for a negative index, as Monarch's
unsigned integers give).  monarch's own meshes don't use them: their shapes are
``monarch.actor.Extent``/``Point`` and a mesh's ``slice``/``flatten``/``rename``/``split``.
``Extent`` and ``Point`` here are ``monarch.actor``'s.
"""

from __future__ import annotations

import itertools
import json
import operator
from typing import Any, Iterator, Sequence

from monarch.actor._shape import Extent, Point  # not monarch.actor: its meshes use these classes (import cycle)

__all__ = ["Extent", "Point", "Region", "Shape", "Slice"]

_py_slice = slice  # Monarch names a parameter ``slice``; the builtin under another name


def _unsigned(value: Any, what: str) -> int:
    """``value`` as a non-negative int, refused as Monarch's ``usize`` arguments refuse it."""
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"argument '{what}': '{type(value).__name__}' object cannot be interpreted as an integer") from None
    if n < 0:
        raise OverflowError("can't convert negative int to unsigned")
    return n


def _unsigned_list(values: Sequence[Any], what: str) -> list[int]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"argument '{what}': Can't extract `str` to `Vec`")
    return [_unsigned(v, what) for v in values]


def _fmt_list(values: Sequence[Any]) -> str:
    return "[" + ", ".join(json.dumps(v) if isinstance(v, str) else str(v) for v in values) + "]"


def _check(sizes: list[int], strides: list[int]) -> None:
    """Refuse a layout whose dimensions would overlap or not nest (Monarch's rules: sorted by
    stride, each stride a multiple of the one before and no smaller than the space it spans)."""
    if len(sizes) != len(strides):
        raise ValueError(f"invalid dims: expected {len(sizes)}, got {len(strides)}")
    prev_stride = prev_size = None
    space = 1
    for stride, size in sorted(zip(strides, sizes)):
        if prev_stride is not None:
            if prev_stride and stride % prev_stride:
                raise ValueError("nonrectangular shape")
            if stride == prev_stride and size != 1 and prev_size != 1:
                raise ValueError("nonunique strides")
        if space > stride:
            raise ValueError(f"stride {stride} must be larger than size of previous space {space}")
        space = stride * size
        prev_stride, prev_size = stride, size


class Slice:
    """Ranks ``offset + sum(coord[i] * strides[i])`` for every coordinate within ``sizes``, in
    row-major order of the coordinates."""

    __slots__ = ("_offset", "_sizes", "_strides")

    def __init__(self, *, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        offset = _unsigned(offset, "offset")
        sizes_l, strides_l = _unsigned_list(sizes, "sizes"), _unsigned_list(strides, "strides")
        _check(sizes_l, strides_l)
        self._offset, self._sizes, self._strides = offset, tuple(sizes_l), tuple(strides_l)

    @staticmethod
    def new_row_major(sizes: Sequence[int]) -> Slice:
        """A dense slice from 0 over ``sizes``, the last dimension varying fastest."""
        sizes_l = _unsigned_list(sizes, "ranks")
        # no dimensions: no strides (one rank, the offset)
        strides = list(itertools.accumulate(reversed(sizes_l[1:]), operator.mul, initial=1))[::-1] if sizes_l else []
        return Slice(offset=0, sizes=sizes_l, strides=strides)

    @staticmethod
    def from_list(ranks: list[int]) -> list[Slice]:
        """One-dimensional slices covering ``ranks`` (sorted), each a run of equal steps."""
        todo = sorted(_unsigned_list(ranks, "ranks"))
        out: list[Slice] = []
        if not todo:
            return out
        offset, size, stride = todo[0], 1, 1
        for rank in todo[1:]:
            if size == 1 and rank > offset:
                stride, size = rank - offset, 2
            elif offset + size * stride == rank:
                size += 1
            else:
                out.append(Slice(offset=offset, sizes=[size], strides=[stride]))
                offset, size, stride = rank, 1, 1
        out.append(Slice(offset=offset, sizes=[size], strides=[stride]))
        return out

    @property
    def ndim(self) -> int:
        return len(self._sizes)

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        return list(self._strides)

    def __len__(self) -> int:
        n = 1
        for s in self._sizes:
            n *= s
        return n

    def _location(self, coords: Sequence[int]) -> int:
        return self._offset + sum(c * s for c, s in zip(coords, self._strides))

    def __iter__(self) -> Iterator[int]:
        for coords in itertools.product(*(range(s) for s in self._sizes)):
            yield self._location(coords)

    def _get(self, index: int, error: type[Exception]) -> int:
        total = len(self)
        if index >= total:
            raise error(f"index {index} out of range {total}")
        value, rest = self._offset, index
        for size, stride in zip(reversed(self._sizes), reversed(self._strides)):
            value += (rest % size) * stride
            rest //= size
        return value

    def get(self, index: int) -> int:
        """The rank at row-major position ``index`` (the inverse of ``index``)."""
        return self._get(_unsigned(index, "index"), ValueError)

    def coordinates(self, value: int) -> list[int]:
        """The coordinates of rank ``value``; ``ValueError`` when it is not in the slice."""
        value = _unsigned(value, "value")
        pos = value - self._offset
        if pos < 0:
            raise ValueError(f"value {value} not in slice")
        coords = [0] * len(self._sizes)
        for stride, dim in sorted(((st, i) for i, st in enumerate(self._strides)), reverse=True):
            size = self._sizes[dim]
            index, pos = (pos // stride, pos % stride) if size > 1 else (0, pos)
            if index >= size:
                raise ValueError(f"value {value} not in slice")
            coords[dim] = index
        if pos:
            raise ValueError(f"value {value} not in slice")
        return coords

    def index(self, value: int) -> int:
        """The row-major position of rank ``value`` (the inverse of ``get``)."""
        result, step = 0, 1
        for c, size in zip(reversed(self.coordinates(value)), reversed(self._sizes)):
            result += c * step
            step *= size
        return result

    def nditem(self, coordinates: list[int]) -> int:
        """The rank at ``coordinates`` (one per dimension, else ``IndexError``)."""
        coords = _unsigned_list(coordinates, "coordinates")
        if len(coords) != len(self._sizes):
            raise IndexError(f"invalid dims: expected {len(self._sizes)}, got {len(coords)}")
        return self._location(coords)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if start < 0 or stop < 0:
                raise IndexError("Only positive indices are support")
            return tuple(self._get(k, IndexError) for k in range(start, stop, step))
        try:
            index = _unsigned(i, "range")
        except (TypeError, OverflowError) as e:
            # Monarch takes an int or a slice here: neither fitting is a TypeError, a negative int too
            raise TypeError(f"argument 'range': failed to extract enum Range ('int | slice'): {e}") from None
        return self._get(index, IndexError)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Slice):
            return False
        return (self._offset, self._sizes, self._strides) == (other._offset, other._sizes, other._strides)

    def __hash__(self) -> int:
        return hash((self._offset, self._sizes, self._strides))

    def __getnewargs_ex__(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), {"offset": self._offset, "sizes": list(self._sizes), "strides": list(self._strides)}

    def __reduce__(self) -> tuple[Any, ...]:
        return _slice, (self._offset, list(self._sizes), list(self._strides))

    def __repr__(self) -> str:
        return f"Slice {{ offset: {self._offset}, sizes: {_fmt_list(self._sizes)}, strides: {_fmt_list(self._strides)} }}"

    __str__ = __repr__

    # what Shape and Region cut with (Monarch's ndslice ``at`` and ``select``)
    def _at(self, dim: int, index: int) -> Slice:
        sizes, strides = list(self._sizes), list(self._strides)
        offset = self._offset + index * strides[dim]
        del sizes[dim], strides[dim]
        return Slice(offset=offset, sizes=sizes, strides=strides)

    def _select(self, dim: int, begin: int, end: int, step: int) -> Slice:
        sizes, strides = list(self._sizes), list(self._strides)
        offset = self._offset + begin * strides[dim]
        sizes[dim] = -(-(end - begin) // step)
        strides[dim] *= step
        return Slice(offset=offset, sizes=sizes, strides=strides)


def _slice(offset: int, sizes: list[int], strides: list[int]) -> Slice:
    return Slice(offset=offset, sizes=sizes, strides=strides)


def _labels(labels: Sequence[str]) -> list[str]:
    if isinstance(labels, str):
        raise TypeError("argument 'labels': Can't extract `str` to `Vec`")
    out = list(labels)
    for label in out:
        if not isinstance(label, str):
            raise TypeError(f"argument 'labels': '{type(label).__name__}' object cannot be converted to 'PyString'")
    return out


def _range_text(begin: int, end: int, step: int) -> str:
    return f"{begin}:{end}:{step}"


class Shape:
    """A ``Slice`` with a label per dimension, e.g. ``{host=2,gpu=8}``."""

    __slots__ = ("_labels", "_slice")
    __hash__ = None  # type: ignore[assignment]  # equal shapes compare equal; Monarch's don't hash

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:
        names = _labels(labels)
        if not isinstance(slice, Slice):
            raise TypeError(f"argument 'slice': '{type(slice).__name__}' object is not an instance of 'Slice'")
        if len(names) != slice.ndim:
            raise ValueError(f"label slice dimension mismatch: {len(names)} != {slice.ndim}")
        self._labels, self._slice = tuple(names), slice

    @staticmethod
    def unity() -> Shape:
        """The shape with no dimensions: one rank, 0."""
        return Shape([], Slice(offset=0, sizes=[], strides=[]))

    @property
    def ndslice(self) -> Slice:
        return self._slice

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def extent(self) -> Extent:
        return Extent(list(self._labels), self._slice.sizes)

    @property
    def region(self) -> Region:
        return Region(list(self._labels), self._slice)

    def _dim(self, label: str) -> int:
        try:
            return self._labels.index(label)
        except ValueError:
            raise ValueError(f"invalid labels `{_fmt_list([label])}`") from None

    def at(self, label: str, index: int) -> Shape:
        """This shape at ``index`` of dimension ``label``, without that dimension."""
        index = _unsigned(index, "index")
        dim = self._dim(label)
        size = self._slice.sizes[dim]
        if index >= size:
            raise ValueError(f"out of range {_range_text(index, index + 1, 1)} for dimension {label} of size {size}")
        labels = list(self._labels)
        del labels[dim]
        return Shape(labels, self._slice._at(dim, index))

    def select(self, label: str, slice: slice) -> Shape:  # noqa: A002  (Monarch's parameter name)
        """This shape with dimension ``label`` cut to the positions ``slice`` picks (kept)."""
        if not isinstance(slice, _py_slice):
            raise TypeError(f"argument 'slice': '{type(slice).__name__}' object cannot be cast as 'slice'")
        dim = self._dim(label)
        size = self._slice.sizes[dim]
        begin, end, step = slice.indices(size)
        if step < 0:
            raise ValueError(f"a shape's dimension is cut in order: step {step} is negative")
        text = _range_text(begin, end, step)
        end = min(end, size)
        if begin >= size:
            raise ValueError(f"out of range {text} for dimension {label} of size {size}")
        if end <= begin:
            raise ValueError(f"empty range {text}")
        return Shape(self._labels, self._slice._select(dim, begin, end, step))

    def index(self, **kwargs: int) -> Shape:
        """``at`` for each ``label=index`` given, in order."""
        shape = self
        for label, index in kwargs.items():
            shape = shape.at(label, _unsigned(index, "index"))
        return shape

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where rank ``rank`` is in this shape, e.g. ``{host: 1, gpu: 3}``."""
        return dict(zip(self._labels, self._slice.coordinates(rank)))

    def ranks(self) -> list[int]:
        return list(self._slice)

    def __len__(self) -> int:
        return len(self._slice)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and self._labels == other._labels and self._slice == other._slice

    def __reduce__(self) -> tuple[Any, ...]:
        return Shape, (list(self._labels), self._slice)

    def __str__(self) -> str:
        return "{" + ",".join(f"{label}={size}" for label, size in zip(self._labels, self._slice.sizes)) + "}"

    def __repr__(self) -> str:
        return f"Shape {{ labels: {_fmt_list(self._labels)}, slice: {self._slice!r} }}"


class Region:
    """Labelled ranks within a possibly larger space (a ``Shape``'s labels and slice)."""

    __slots__ = ("_labels", "_slice")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:  # noqa: A002
        self._labels, self._slice = tuple(_labels(labels)), slice

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    def slice(self) -> Slice:
        return self._slice

    def as_shape(self) -> Shape:
        return Shape(list(self._labels), self._slice)

    def point_of_base_rank(self, rank: int) -> Point:
        """The point of this region that rank ``rank`` of the space around it is."""
        return Point(self._slice.index(rank), Extent(list(self._labels), self._slice.sizes))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Region) and self._labels == other._labels and self._slice == other._slice

    def __reduce__(self) -> tuple[Any, ...]:
        return Region, (list(self._labels), self._slice)
