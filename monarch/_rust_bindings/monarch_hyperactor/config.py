"""Compatibility only: Monarch's ``config`` names, aliases of ``monarch.config``'s."""

from monarch.config import Encoding  # noqa: F401
