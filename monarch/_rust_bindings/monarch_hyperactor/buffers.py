"""Compatibility only: Monarch's ``buffers`` names, from ``monarch._src.actor.pickle`` (plain Python)."""

from monarch._src.actor.pickle import Buffer, FrozenBuffer  # noqa: F401
