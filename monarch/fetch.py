"""PyTorch Monarch's ``monarch.fetch``: ``fetch_shard`` and ``inspect`` (the same functions as
``monarch.fetch_shard`` / ``monarch.inspect``, from the tensor engine) and ``show``, which draws
one shard of a remote tensor with ``torchshow`` (installed separately).  Monarch's examples import
them from here (docs/source/examples/grpo_actor_te.py)."""

from __future__ import annotations

from typing import Any

from monarch._tensor.mesh import no_mesh
from monarch._tensor.remote import fetch_shard, inspect

__all__ = ["fetch_shard", "inspect", "show"]


def show(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> object:
    """Draw the shard ``shard`` (or ``**kwargs``) of ``obj`` here with ``torchshow``."""
    value = inspect(obj, shard, **kwargs)
    from torchshow import show as draw  # not a dependency: only this function needs it

    with no_mesh.activate():
        return draw(value)
