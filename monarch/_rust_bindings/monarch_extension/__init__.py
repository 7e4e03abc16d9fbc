"""Compatibility only (see ``monarch._rust_bindings``)."""
