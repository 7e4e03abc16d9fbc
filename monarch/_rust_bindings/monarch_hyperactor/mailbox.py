"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.mailbox``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

PortId = placeholder(__name__, "PortId")
PortRef = placeholder(__name__, "PortRef")
UndeliverableMessageEnvelope = placeholder(__name__, "UndeliverableMessageEnvelope")
Mailbox = placeholder(__name__, "Mailbox")
PortReceiver = placeholder(__name__, "PortReceiver")
del placeholder_function
