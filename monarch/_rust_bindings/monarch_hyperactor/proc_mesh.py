"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.proc_mesh``
(see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function

ProcMesh = placeholder(__name__, "ProcMesh")
del placeholder_function
