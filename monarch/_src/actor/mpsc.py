"""Compatibility only: Monarch's ``monarch._src.actor.mpsc``: its runtime's channel ``Receiver`` is
a placeholder (see ``monarch._src._placeholder``); monarch's channels are ``monarch.actor.Channel``."""

from monarch._src._placeholder import placeholder

Receiver = placeholder(__name__, "Receiver", "monarch's channels are monarch.actor.Channel")
