"""Compatibility only: a placeholder for Monarch's ``Workspace`` (monarch's is ``monarch.job``'s workspace)."""

from monarch._src._placeholder import placeholder

Workspace = placeholder(__name__, "Workspace")
