"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.actor_mesh``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

hold_gil_for_test = placeholder_function(__name__, "hold_gil_for_test")
del placeholder
