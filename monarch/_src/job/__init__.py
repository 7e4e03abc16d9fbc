"""Compatibility only (see ``monarch._src``)."""
