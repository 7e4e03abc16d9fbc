"""Compatibility only: Monarch's ``monarch._src.gather_mount`` (see ``gather_mount``)."""
