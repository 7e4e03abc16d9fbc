"""Compatibility only: Monarch's ``monarch._rust_bindings.monarch_hyperactor.actor_mesh`` test
utility ``hold_gil_for_test``.

The code is in ``monarch.actor._gil_hold``; this module only names it (why: see ``shape``)."""

from monarch.actor._gil_hold import hold_gil_for_test

__all__ = ["hold_gil_for_test"]
