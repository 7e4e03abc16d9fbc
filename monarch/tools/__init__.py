"""Compatibility only: Monarch's ``monarch.tools`` (its TorchX launcher) is ``monarch_cli`` and
``monarch.job`` here.  Its helpers a launcher script uses are real (``network``, ``utils``,
``config.environment``); the other names its tests import are placeholders (see
``monarch._src._placeholder``)."""
