"""Compatibility only: Monarch's ``monarch._src.actor.future.Future``, alias of ``monarch.actor``'s."""

from monarch.actor import Future  # noqa: F401
