"""Compatibility only: PyTorch Monarch's ``monarch._rust_bindings.monarch_hyperactor.proc``
(``ActorAddr``), from ``monarch.actor._mailbox``; this module only names it."""

from monarch.actor._mailbox import ActorAddr

ActorAddr.__module__ = __name__

__all__ = ["ActorAddr"]
