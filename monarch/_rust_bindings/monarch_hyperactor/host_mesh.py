"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.host_mesh``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

BootstrapCommand = placeholder(__name__, "BootstrapCommand")
del placeholder_function
