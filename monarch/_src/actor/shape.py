"""Compatibility only: Monarch's ``monarch._src.actor.shape`` names: placeholders (see
``monarch._src._placeholder``); monarch's shapes are ``monarch.actor.Extent``, ``Point`` and a
mesh's ``slice``/``flatten``/``rename``/``split``."""

from monarch._src._placeholder import placeholder

MeshTrait = placeholder(__name__, "MeshTrait")
NDSlice = placeholder(__name__, "NDSlice")
Shape = placeholder(__name__, "Shape")
ShapeExt = placeholder(__name__, "ShapeExt")
Slice = placeholder(__name__, "Slice")
