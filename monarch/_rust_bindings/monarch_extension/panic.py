"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_extension.panic``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

panicking_function = placeholder_function(__name__, "panicking_function")
del placeholder
