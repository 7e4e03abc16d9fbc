"""Compatibility only: Monarch's ``pywaker`` names, from ``monarch._src.actor.waker`` (plain Python)."""

from monarch._src.actor.waker import Event, PyTestWaker  # noqa: F401
