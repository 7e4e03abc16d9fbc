"""Compatibility only: PyTorch Monarch's ``monarch._rust_bindings.monarch_hyperactor.shape``
(``Slice``, ``Shape``, ``Region``; ``Extent`` and ``Point`` are ``monarch.actor``'s).

The code is in ``monarch.actor._region``; this module only names it.  Monarch's tests walk every
name of every module under ``monarch._rust_bindings`` and resolve it through its ``__module__``,
so a binding module holds no imported module, no ``__future__`` feature and no private object.
The classes say they live here, as Monarch's do, so their pickles name Monarch's path."""

from monarch.actor._region import Extent, Point, Region, Shape, Slice

Region.__module__ = Shape.__module__ = Slice.__module__ = __name__

__all__ = ["Extent", "Point", "Region", "Shape", "Slice"]
