"""Compatibility only: PyTorch Monarch's ``monarch._rust_bindings.monarch_hyperactor.actor``:
``PythonMessage`` and ``PythonMessageKind`` are plain Python (``monarch.actor._mailbox``; this
module only names them), the rest placeholders (see ``monarch._src._placeholder``)."""

from monarch._src._placeholder import placeholder, placeholder_function
from monarch.actor._mailbox import PythonMessage, PythonMessageKind

PythonMessage.__module__ = PythonMessageKind.__module__ = __name__
MethodSpecifier = placeholder(__name__, "MethodSpecifier")
del placeholder_function
