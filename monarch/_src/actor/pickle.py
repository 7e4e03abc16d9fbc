"""Compatibility only: placeholders for Monarch's ``monarch._src.actor.pickle`` (see
``monarch._src._placeholder``); monarch's meshes pickle with ``pickle``."""

from monarch._src._placeholder import placeholder_function

flatten = placeholder_function(__name__, "flatten")
unflatten = placeholder_function(__name__, "unflatten")
