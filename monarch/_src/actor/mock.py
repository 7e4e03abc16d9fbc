"""Compatibility only: Monarch's ``monarch._src.actor.mock`` (``patch_actor``), alias of ``monarch.actor._mock``:
``_actor_registry`` is its registry of patches (original class -> mock), and
``get_actor_mock_registry_state`` copies it out and ``set_actor_mock_registry_state`` adds a copy's
patches back (how patches reach procs)."""

from monarch.actor._mock import _registry as _actor_registry  # noqa: F401
from monarch.actor._mock import actor_class as get_actor_class, patch_actor  # noqa: F401
from monarch.actor._mock import registry_state as _registry_state
from monarch.actor._mock import set_registry_state as _set_registry_state


def get_actor_mock_registry_state() -> dict:
    """The patches in force now: {original class: mock class} (a copy)."""
    return _registry_state()[1]


def set_actor_mock_registry_state(state: dict) -> None:
    """Add the patches of ``state`` (as Monarch's: those already in force and not in it stay)."""
    _set_registry_state({**_registry_state()[1], **state})


def patch_tensor_engine(*args, **kwargs):
    """Monarch's mock tensor engine is not part of monarch (its real one is: README)."""
    raise NotImplementedError("patch_tensor_engine: monarch has no mock tensor engine (the real one runs on CPU)")
