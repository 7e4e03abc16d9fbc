"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.buffers``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

Buffer = placeholder(__name__, "Buffer")
del placeholder_function
