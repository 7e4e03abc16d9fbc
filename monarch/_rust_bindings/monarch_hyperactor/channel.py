"""Compatibility only: Monarch's ``channel`` names (``ChannelTransport`` and ``BindSpec`` are monarch's)."""

from monarch.actor import ChannelTransport  # noqa: F401
from monarch.config import BindSpec  # noqa: F401
