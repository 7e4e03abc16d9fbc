"""Compatibility only: Monarch's ``pympsc`` names, from ``monarch._src.actor.mpsc`` (plain Python)."""

from monarch._src.actor.mpsc import PyTestSender, Receiver, channel_for_test  # noqa: F401
