"""Compatibility only: Monarch's ``monarch._src.actor.logging`` names.

Monarch forwards a proc's output to the client through flush tasks a test may wait for; a proc's
output reaches monarch's client through its host agent, with no task here to wait for."""

_pending_flush_tasks: set = set()
