"""Compatibility only: Monarch's ``monarch._src.actor.concurrent`` names, aliases of ``monarch.actor``'s."""

from monarch.actor import concurrent_endpoint  # noqa: F401
