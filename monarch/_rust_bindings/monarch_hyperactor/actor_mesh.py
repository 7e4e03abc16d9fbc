"""Compatibility only: Monarch's ``monarch._rust_bindings.monarch_hyperactor.actor_mesh`` test
utility ``hold_gil_for_test``, and ``PythonActorMesh`` (its runtime's mesh, a placeholder: see
``monarch._src._placeholder``).

The code is in ``monarch.actor._gil_hold``; this module only names it (why: see ``shape``)."""

from monarch._src._placeholder import placeholder
from monarch.actor._gil_hold import hold_gil_for_test

PythonActorMesh = placeholder(__name__, "PythonActorMesh")
del placeholder

__all__ = ["PythonActorMesh", "hold_gil_for_test"]
