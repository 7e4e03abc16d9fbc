"""Compatibility only: Monarch's ``monarch._rust_bindings.monarch_hyperactor.value_mesh``:
``ValueMesh`` is ``monarch.actor.ValueMesh``.

No ``from __future__ import annotations`` here: Monarch's tests resolve every name of a binding
module through its ``__module__`` (see ``shape``)."""

from typing import Any, Sequence

from monarch._rust_bindings.monarch_hyperactor.shape import Shape, Slice
from monarch.actor._shape import ValueMesh

__all__ = ["ValueMesh"]


def _make_test_value_mesh(labels: Sequence[str], sizes: Sequence[int], values: Sequence[Any]) -> ValueMesh:
    """A row-major ValueMesh of ``values`` over ``labels``/``sizes`` (what Monarch's tests build one with)."""
    return ValueMesh(Shape(list(labels), Slice.new_row_major(list(sizes))), list(values))
