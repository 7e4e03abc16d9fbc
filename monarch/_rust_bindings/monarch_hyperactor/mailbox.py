"""Compatibility only: PyTorch Monarch's ``monarch._rust_bindings.monarch_hyperactor.mailbox``:
``PortId``, ``PortRef`` and ``UndeliverableMessageEnvelope`` are plain Python
(``monarch.actor._mailbox``; this module only names them, and they say they live here, as
Monarch's do), the rest placeholders (see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function
from monarch.actor._mailbox import PortId, PortRef, UndeliverableMessageEnvelope

PortId.__module__ = PortRef.__module__ = UndeliverableMessageEnvelope.__module__ = __name__
Mailbox = placeholder(__name__, "Mailbox")
PortReceiver = placeholder(__name__, "PortReceiver")
del placeholder_function
