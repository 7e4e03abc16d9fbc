"""monarch: reserve hosts once, run many times.

``monarch.actor`` is the actor API; ``monarch.job`` loads a reservation made by
``monarch serve``.  The tensor engine's names (``fetch_shard``, ``inspect``,
``remote``, ``reduce``, ``Stream``, ``no_mesh``, ...) are PyTorch Monarch's and load
on first use, so ``import monarch`` does not import torch.
"""

__version__ = "0.1.0"

_TENSOR_API = {
    "Tensor": "monarch._tensor.tensor",
    "reduce": "monarch._tensor.tensor",
    "reduce_": "monarch._tensor.tensor",
    "to_mesh": "monarch._tensor.tensor",
    "slice_mesh": "monarch._tensor.tensor",
    "Stream": "monarch._tensor.stream",
    "get_active_stream": "monarch._tensor.stream",
    "no_mesh": "monarch._tensor.mesh",
    "get_active_mesh": "monarch._tensor.mesh",
    "DeviceMesh": "monarch._tensor.mesh",
    "remote": "monarch._tensor.remote",
    "fetch_shard": "monarch._tensor.remote",
    "inspect": "monarch._tensor.remote",
    "call_on_shard_and_fetch": "monarch._tensor.remote",
    "RemoteException": "monarch._tensor.controller",
}


def __getattr__(name: str):
    module = _TENSOR_API.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_TENSOR_API])
