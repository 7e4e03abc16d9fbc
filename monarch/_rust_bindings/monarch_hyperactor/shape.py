"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.shape``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

Shape = placeholder(__name__, "Shape")
Slice = placeholder(__name__, "Slice")
Point = placeholder(__name__, "Point")
del placeholder_function
