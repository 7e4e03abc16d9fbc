"""Compatibility only: Monarch's ``monarch._rust_bindings.monarch_hyperactor.selection.Selection``.

The code is in ``monarch.actor._selection``; this module only names it (why: see ``shape``)."""

from monarch.actor._selection import Selection

Selection.__module__ = __name__

__all__ = ["Selection"]
