"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.proc``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

ActorAddr = placeholder(__name__, "ActorAddr")
del placeholder_function
