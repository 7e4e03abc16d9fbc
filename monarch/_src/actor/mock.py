"""Compatibility only: Monarch's ``monarch._src.actor.mock`` (``patch_actor``), alias of ``monarch.actor._mock``."""

from monarch.actor._mock import actor_class as get_actor_class, patch_actor  # noqa: F401


def patch_tensor_engine(*args, **kwargs):
    """Monarch's mock tensor engine is not part of monarch (its real one is: README)."""
    raise NotImplementedError("patch_tensor_engine: monarch has no mock tensor engine (the real one runs on CPU)")
