"""Compatibility only: Monarch's ``monarch._src.actor.bootstrap`` names, aliases of ``monarch.actor``'s."""

from monarch.actor import attach_to_workers, run_worker_loop_forever  # noqa: F401
