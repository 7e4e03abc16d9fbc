"""Compatibility only: Monarch's ``monarch._src.actor.code_sync`` (see ``auto_reload``)."""
