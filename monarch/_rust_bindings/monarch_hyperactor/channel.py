"""Compatibility only: Monarch's ``channel`` names (``ChannelTransport`` is monarch's)."""

from monarch._src._placeholder import placeholder
from monarch.actor import ChannelTransport  # noqa: F401

BindSpec = placeholder(__name__, "BindSpec")
