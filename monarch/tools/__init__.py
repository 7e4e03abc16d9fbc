"""Compatibility only: Monarch's ``monarch.tools`` (its TorchX launcher) is ``monarch_cli`` and
``monarch.job`` here; the names its tests import are placeholders (see ``monarch._src._placeholder``)."""
