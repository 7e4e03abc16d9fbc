"""Compatibility only: Monarch's ``monarch._src.actor.proc_mesh`` names, aliases of ``monarch.actor``'s."""

from monarch.actor import ProcMesh, get_or_spawn_controller  # noqa: F401
