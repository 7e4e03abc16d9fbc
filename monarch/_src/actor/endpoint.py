"""Compatibility only: Monarch's ``monarch._src.actor.endpoint`` names, aliases of ``monarch.actor``'s."""

from monarch.actor import Endpoint, endpoint  # noqa: F401
