"""``remote(...)`` functions and ``fetch_shard`` / ``inspect``: running user code where the data is.

``remote("mypkg.ops.add", propagate=lambda a, b: a)`` (or ``@remote(propagate=...)`` on
a module-level function) makes a function that, called under an active mesh,
runs on every proc of it with the procs' own tensors and returns remote tensors
at once.  ``propagate`` says what the results look like: a function run on meta
tensors here; ``None`` (or ``"cached"``) runs the function once on one proc, on
copies of its inputs, and remembers the answer per input shape; ``"inspect"``
for functions that return no tensors (use ``.call()`` / ``.call_one()``).
"""

from __future__ import annotations

import functools
import random
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from monarch._tensor import stream as _stream
from monarch._tensor.controller import issuing_frames
from monarch._tensor.tensor import Tensor, _choose, _Inputs, call_remote


def _function_key(fn: Any) -> Any:
    """How a worker finds ``fn``: its dotted name where it can import it, else its pickled bytes."""
    if isinstance(fn, str):
        if "." not in fn:
            raise ValueError(f"a remote function's name is dotted (module.function), got {fn!r}")
        return fn
    if isinstance(fn, torch._ops.OpOverload):
        return f"torch.ops.{fn.namespace}.{fn._opname}.{fn._overloadname}"
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<" not in name:
        return f"{module}.{name}"
    import cloudpickle

    return cloudpickle.dumps(fn)


class Remote:
    """A function run on every proc of the active mesh; calling it returns remote tensors."""

    def __init__(self, fn: Any, propagate: Any = None):
        self._fn = fn
        self._remote_impl = fn
        self._propagate = propagate
        self._key: Any = None
        self._cache: dict = {}
        if callable(fn):
            functools.update_wrapper(self, fn)

    @property
    def key(self) -> Any:
        if self._key is None:
            self._key = _function_key(self._fn)
        return self._key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.rref(*args, **kwargs)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        inputs = _Inputs()
        margs, gargs = inputs.convert(args)
        mkwargs, gkwargs = inputs.convert(kwargs)
        mesh, _ = _choose(inputs, self.key)
        versions = [m._version for m in inputs.metas]
        meta_out = self._meta_result(mesh, margs, mkwargs, gargs, gkwargs, inputs)
        muts = [t.ref for t, m, v in zip(inputs.remotes, inputs.metas, versions) if m._version != v]
        return call_remote(mesh, self.key, gargs, gkwargs, meta_out, inputs, muts)

    def _meta_result(self, mesh: Any, margs: tuple, mkwargs: dict, gargs: tuple, gkwargs: dict,
                     inputs: _Inputs) -> Any:
        p = self._propagate
        if p == "inspect":
            return None
        if p == "mocked":
            raise NotImplementedError("mocked propagation")
        if callable(p):
            with _disable_current_modes():
                return p(*margs, **mkwargs)
        # Run it once on one proc, on copies of the inputs, and remember what came out.
        sig = tuple((tuple(t.shape), t.dtype) for t in inputs.remotes)
        shapes = self._cache.get(sig)
        if shapes is None:
            stream = _stream.get_active_stream()
            rank = mesh.ranks_tuple[0]
            shapes = mesh.client.fetch((rank,), stream.id, "monarch._tensor.worker.describe", (self.key, *gargs),
                                       gkwargs, one=True, clone_inputs=True, frames=issuing_frames()).get()
            self._cache[sig] = shapes
        return _metas(shapes)

    def _send(self, args: tuple, kwargs: dict, one: bool) -> Any:
        from monarch.actor._shape import ValueMesh

        inputs = _Inputs()
        gargs, gkwargs = inputs.message(args), inputs.message(kwargs)
        mesh, stream = _choose(inputs, self.key)
        if one and len(mesh) != 1:
            raise ValueError(f"call_one requires exactly 1 proc, but the active mesh has {len(mesh)}")
        ranks = mesh.ranks_tuple
        fut = mesh.client.fetch(ranks, stream.id, self.key, gargs, gkwargs, one=one, frames=issuing_frames())
        if one:
            return fut
        from monarch._tensor.controller import _mapped

        return _mapped(fut, lambda values: ValueMesh(mesh._shape, values))

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run on every proc of the active mesh; a Future of the ValueMesh of their results."""
        return self._send(args, kwargs, one=False)

    def call_one(self, *args: Any, **kwargs: Any) -> Any:
        """Run on the one proc of the active mesh; a Future of its result."""
        return self._send(args, kwargs, one=True)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Run on every proc of the active mesh; nothing comes back."""
        self.rref(*args, **kwargs) if self._propagate not in (None, "cached") else self._inspect_call(args, kwargs)

    def _inspect_call(self, args: tuple, kwargs: dict) -> None:
        inputs = _Inputs()
        gargs, gkwargs = inputs.message(args), inputs.message(kwargs)
        mesh, _ = _choose(inputs, self.key)
        call_remote(mesh, self.key, gargs, gkwargs, None, inputs)

    def _send_to_port(self, args: tuple, kwargs: dict, port: Any, selection: str) -> None:
        """``monarch.actor.send(fn, args, kwargs, port, selection)``: run on every proc of the active
        mesh (``"choose"``: on one of them, at random), each proc sending its result to ``port``."""
        from monarch._tensor.worker import MyRank

        if selection not in ("all", "choose"):
            raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")
        inputs = _Inputs()
        gargs, gkwargs = inputs.message(args), inputs.message(kwargs)
        mesh, _ = _choose(inputs, self.key)
        if selection == "choose":
            mesh = mesh.slice(**random.choice(mesh.coordinates()))
        if port is None:
            call_remote(mesh, self.key, gargs, gkwargs, None, inputs)
            return
        ranks = {r: i for i, r in enumerate(mesh.ranks_tuple)}
        call_remote(mesh, "monarch._tensor.worker.send_to_port", (self.key, port, ranks, MyRank(), *gargs), gkwargs,
                    None, inputs)

    def _call_name(self) -> Any:
        return self.key


def _metas(shapes: Any) -> Any:
    if type(shapes) is tuple and len(shapes) == 3 and shapes[0] == "tensor":
        return torch.empty(shapes[1], dtype=shapes[2], device="meta")
    if type(shapes) in (tuple, list):
        return type(shapes)(_metas(x) for x in shapes)
    if type(shapes) is dict:
        return {k: _metas(v) for k, v in shapes.items()}
    return shapes


def remote(function: Any = None, *, propagate: Any = None) -> Any:
    """A :class:`Remote` of ``function`` (a dotted name or a module-level function); as a decorator too."""
    if function is None:
        return functools.partial(remote, propagate=propagate)
    return Remote(function, propagate)


# --- bringing values back -----------------------------------------------------------------------


def _find_mesh(obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return obj.mesh
    if type(obj) in (tuple, list):
        for x in obj:
            m = _find_mesh(x)
            if m is not None:
                return m
    if type(obj) is dict:
        return _find_mesh(list(obj.values()))
    return None


def fetch_shard(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Any:
    """A Future of ``obj`` (a pytree of remote tensors) as the proc at ``shard`` has it (default: the first).

    Every tensor comes back as a local CPU tensor; ops issued before it are done first.
    """
    from monarch._tensor.mesh import active

    shard = dict(shard or {}, **kwargs)
    mesh = _find_mesh(obj) or active()
    if mesh is None:
        raise ValueError("fetch_shard needs remote tensors, or an active mesh")
    inputs = _Inputs()
    g = inputs.message(obj)
    for t in inputs.remotes:
        if t.mesh is not mesh:
            raise TypeError(f"fetch_shard: tensors of several meshes ({t.mesh!r} and {mesh!r})")
    sid = inputs.remotes[0]._sid if inputs.remotes else _stream.get_active_stream().id
    rank = mesh._process(shard)
    return mesh.client.fetch((rank,), sid, None, (g,), {}, one=True, frames=issuing_frames())


def inspect(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Any:
    """``fetch_shard(obj, shard, **kwargs).result()``."""
    return fetch_shard(obj, shard, **kwargs).result()


def call_on_shard_and_fetch(fn: Any, *args: Any, shard: dict[str, int] | None = None, **kwargs: Any) -> Any:
    """Run a remote function on one proc (at ``shard``) and bring its result back."""
    from monarch._tensor.mesh import active

    r = fn if isinstance(fn, Remote) else Remote(fn, "inspect")
    inputs = _Inputs()
    gargs, gkwargs = inputs.message(args), inputs.message(kwargs)
    mesh = inputs.remotes[0].mesh if inputs.remotes else active()
    if mesh is None:
        raise ValueError("call_on_shard_and_fetch needs remote tensors, or an active mesh")
    sid = _stream.get_active_stream().id
    return mesh.client.fetch((mesh._process(shard),), sid, r.key, gargs, gkwargs, one=True, frames=issuing_frames())


def endpoint_rref(actors: Any, method: str, propagate: Any, args: tuple, kwargs: dict) -> Any:
    """``actors.method.rref(*args)``: each proc's worker calls its own actor, in stream order, with its
    shards, and keeps the result as a remote tensor."""
    if not callable(propagate):
        raise ValueError(f"{method}.rref needs the endpoint's result shape: @endpoint(propagate=lambda ...: ...)")
    inputs = _Inputs()
    margs, gargs = inputs.convert(args)
    mkwargs, gkwargs = inputs.convert(kwargs)
    mesh, _ = _choose(inputs, method)
    with _disable_current_modes():
        meta_out = propagate(*margs, **mkwargs)
    from monarch._tensor.worker import MyRank

    procs = {i: actors._procs[i].addr for i in actors._shape.indices}
    return call_remote(mesh, "monarch._tensor.worker.call_actor", (actors._actor_id, actors._name, procs, method,
                                                                   gargs, gkwargs, MyRank()), {}, meta_out, inputs)
