"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.actor``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

PythonMessage = placeholder(__name__, "PythonMessage")
PythonMessageKind = placeholder(__name__, "PythonMessageKind")
MethodSpecifier = placeholder(__name__, "MethodSpecifier")
del placeholder_function
