"""Remote tensors: ``torch.Tensor``s whose values live on the procs of a mesh.

A :class:`Tensor` here holds only a *meta* tensor (shape, strides, dtype, no
data) and the id of its value on the workers.  Every aten op on one (and, while
a mesh is active, every factory op) comes through :func:`dispatch`: the op runs
on the meta tensors first, which gives the result's shape and dtype at once
(and shape errors here, as local torch would raise them), then it is recorded
for the workers, which run it on the real tensors.  Autograd works above this
layer, so ``loss.backward()`` on the controller records the backward ops too.

When a Tensor object is collected here its remote value is deleted with the
next batch; :meth:`Tensor.drop` does it at once.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from monarch._tensor import stream as _stream
from monarch._tensor.controller import issuing_frames
from monarch._tensor.worker import ALIAS, CALL, LEND, MOVE, REDUCE, SIGNAL, WAIT, Ref, local_shard

_META = torch.device("meta")
_CPU = torch.device("cpu")
_local = threading.local()
_keys: dict[Any, str] = {}

# Wrong-argument errors are ValueError, not TypeError: a TypeError in ``a + b`` makes Python try
# ``b.__radd__`` and then say only "unsupported operand type(s)".
_EXPLAIN = {
    "LOCAL": "a local tensor can only be used on a mesh by value; use `with no_mesh.activate():` for local compute",
    "MESH": "this tensor lives on another mesh; activate that mesh, or move it with `to_mesh`",
    "STREAM": "this tensor belongs to another stream; use it there, or `stream.borrow(t)`",
    "DROPPED": "this tensor was dropped (t.drop()) and can no longer be used",
}


class Tensor(torch.Tensor):
    """A tensor on every proc of a mesh; the controller knows its shape and dtype, not its values."""

    mesh: Any
    ref: int | None
    _sid: int
    _stream_obj: Any
    _r: Ref

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, meta: torch.Tensor, mesh: Any, stream: Any, ref: int | None = None) -> "Tensor":
        return _new(meta.size(), meta.stride(), meta.dtype, mesh, stream, ref)

    @property
    def _meta(self) -> torch.Tensor:
        """A meta tensor of this one's shape, strides and dtype (a fresh one each time)."""
        with _disable_current_modes():
            return torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device=_META)

    @classmethod
    def _build(cls, size: Any, stride: Any, dtype: Any, mesh: Any, stream: Any, ref: int | None) -> "Tensor":
        r = torch.Tensor._make_wrapper_subclass(cls, size, strides=stride, dtype=dtype, device=_CPU,
                                                requires_grad=False)
        r.mesh = mesh
        r._stream_obj = stream
        r._sid = stream.id
        rid = mesh.client.new_ref() if ref is None else ref
        r.ref = rid
        r._r = Ref(rid)
        return r

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __del__(self) -> None:
        ref = getattr(self, "ref", None)
        if ref is not None:
            self.mesh.client.dropped(self._sid, ref)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return dispatch(func, args, kwargs or {})

    @property
    def stream(self) -> Any:
        return self._stream_obj

    @property
    def dropped(self) -> bool:
        return self.ref is None

    def drop(self) -> None:
        """Delete the remote value now; later uses of this tensor raise."""
        if self.ref is not None:
            self.mesh.client.dropped(self._sid, self.ref)
            self.ref = None

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return (f"monarch.Tensor(shape={tuple(self.shape)}, dtype={self.dtype}, mesh={self.mesh!r}, "
                f"stream={self._stream_obj.name!r})")

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce_ex__(self, proto: Any) -> Any:
        """Sent to an actor of the same procs (an endpoint's argument), it arrives as that proc's
        local shard, once the ops that make it have run there."""
        if self.ref is None:
            raise ValueError(f"{_EXPLAIN['DROPPED']}: {self!r}")
        client = self.mesh.client
        client.check()
        made = client.new_event()
        client.record((LEND, self.mesh.op_ranks, self._sid, made, self.ref))
        client.flush()
        return local_shard, (self.ref, made)

    def reduce(self, dims: str | tuple = (), reduction: str = "sum", scatter: bool = False, mesh: Any = None,
               _inplace: bool = False, out: Any = None) -> "Tensor":
        """A collective over mesh dims: sum/avg/product/min/max/band/bor/bxor, or stack (gather);
        ``scatter`` splits the result's first dim across the group."""
        return _reduce(self, dims, reduction, scatter, mesh, _inplace, out)

    def reduce_(self, dims: str | tuple = (), reduction: str = "sum", scatter: bool = False,
                mesh: Any = None) -> "Tensor":
        return _reduce(self, dims, reduction, scatter, mesh, True, None)

    def slice_mesh(self, **dims: Any) -> "MeshSliceTensor":
        """This tensor on a slice of its mesh, to be moved with ``.to_mesh(other)``."""
        return MeshSliceTensor(self, self.mesh.slice(**dims))

    def to_mesh(self, mesh: Any, stream: Any = None) -> "Tensor":
        return MeshSliceTensor(self, self.mesh).to_mesh(mesh, stream)


def _new(size: Any, stride: Any, dtype: Any, mesh: Any, stream: Any, ref: int | None = None) -> Tensor:
    return Tensor._build(size, stride, dtype, mesh, stream, ref)


# --- dispatch ----------------------------------------------------------------------------------


class _Mode(TorchDispatchMode):
    """Pushed while a mesh is active: factories and ops on remote tensors go to the mesh.

    Ops whose tensors are all local stay local (``inspect``'s result can be indexed inside the
    block), except ``torch.tensor(...)`` (``lift_fresh``), which makes a remote tensor of that value
    as factories do; a local tensor mixed with remote ones is sent by value.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        from monarch._tensor.mesh import active

        kwargs = kwargs or {}
        kind = _tensors_in((args, kwargs))
        if kind == _REMOTE or (kind == _NONE and active() is not None) or \
                (func in _LIFT and active() is not None):
            return dispatch(func, args, kwargs)
        return func(*args, **kwargs)


_LIFT = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift.default}
_NONE, _LOCAL, _REMOTE = 0, 1, 2


def _tensors_in(obj: Any) -> int:
    """_REMOTE if ``obj`` holds a remote tensor, else _LOCAL if it holds a local one, else _NONE."""
    t = type(obj)
    if t is Tensor:
        return _REMOTE
    if t is tuple or t is list:
        best = _NONE
        for x in obj:
            k = _tensors_in(x)
            if k == _REMOTE:
                return k
            best = max(best, k)
        return best
    if t is dict:
        return _tensors_in(list(obj.values()))
    if isinstance(obj, torch.Tensor):
        return _REMOTE if isinstance(obj, Tensor) else _LOCAL
    return _NONE


@contextlib.contextmanager
def dispatch_mode() -> Iterator[None]:
    """Push the mode once per thread, however deep the ``activate()`` blocks nest."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        if depth:
            yield
        else:
            with _Mode():
                yield
    finally:
        _local.depth = depth


class _Inputs:
    """What one op's arguments hold: remote tensors (checked, and their metas for propagation)."""

    __slots__ = ("remotes", "locals", "metas", "sig")

    def __init__(self) -> None:
        self.remotes: list[Tensor] = []
        self.locals: list[torch.Tensor] = []
        self.metas: list[torch.Tensor] = []
        self.sig: list = []  # what decides the result's metadata, for the propagation cache

    def message(self, obj: Any) -> Any:
        """``obj`` as the workers get it (remote tensors as Refs); notes its signature."""
        t = type(obj)
        if t is Tensor:
            if obj.ref is None:
                raise ValueError(f"{_EXPLAIN['DROPPED']}: {obj!r}")
            self.remotes.append(obj)
            self.sig.append((obj.shape, obj.stride(), obj.dtype))
            return obj._r
        if t is tuple or t is list:
            self.sig.append((t, len(obj)))
            return t([self.message(x) for x in obj])
        if t is dict:
            self.sig.append((dict, tuple(obj)))
            return {k: self.message(v) for k, v in obj.items()}
        if isinstance(obj, torch.Tensor):
            if isinstance(obj, Tensor):
                return self.message_subclass(obj)
            self.locals.append(obj)
            self.sig.append(("local", obj.shape, obj.dtype, obj.device))
            return obj.detach()
        self.sig.append((t, obj))
        return obj

    def message_subclass(self, obj: Tensor) -> Any:
        self.remotes.append(obj)
        self.sig.append((obj.shape, obj.stride(), obj.dtype))
        return obj._r

    def meta(self, obj: Any) -> Any:
        """``obj`` with tensors as meta tensors (remote ones in the order ``message`` met them)."""
        t = type(obj)
        if isinstance(obj, torch.Tensor):
            if isinstance(obj, Tensor):
                m = obj._meta
                self.metas.append(m)
                return m
            with _disable_current_modes():
                return obj.to(_META)
        if t is tuple or t is list:
            return t([self.meta(x) for x in obj])
        if t is dict:
            return {k: self.meta(v) for k, v in obj.items()}
        if t is torch.device:
            return _META
        return obj

    def convert(self, obj: Any) -> tuple[Any, Any]:
        """(meta version, message version) of an argument."""
        g = self.message(obj)
        return self.meta(obj), g


def _key(func: Any) -> str:
    k = _keys.get(func)
    if k is None:
        k = _keys[func] = f"torch.ops.{func.namespace}.{func._opname}.{func._overloadname}"
    return k


def _choose(inputs: _Inputs, what: Any) -> tuple[Any, Any]:
    """The mesh and stream an op runs on, checked against its tensors."""
    from monarch._tensor.mesh import active

    ambient = active()
    stream = _stream.get_active_stream()
    mesh = inputs.remotes[0].mesh if inputs.remotes else ambient
    if mesh is None:
        raise ValueError(f"{what}: no mesh is active (use `with proc_mesh.activate():`)")
    for t in inputs.remotes:
        if t.mesh is not mesh:
            raise ValueError(f"{what}: {_EXPLAIN['MESH']} ({t.mesh!r}, not {mesh!r})")
        if t._sid != stream.id:
            raise ValueError(f"{what}: {_EXPLAIN['STREAM']} ({t.stream}, not {stream})")
    if ambient is not None and ambient is not mesh:
        raise ValueError(f"{what}: {_EXPLAIN['MESH']} ({mesh!r}, while {ambient!r} is active)")
    return mesh, stream


#: Propagation results by (op, argument signature): what a training loop repeats is computed once.
_CACHE: dict = {}
_CACHE_MAX = 8192


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Work out the result's metadata (from the cache, or by running ``func`` on meta tensors)
    and record the op for the mesh."""
    inputs = _Inputs()
    gargs = inputs.message(args)
    gkwargs = inputs.message(kwargs)
    mesh, stream = _choose(inputs, func)
    client = mesh.client
    client.check()
    if func is torch.ops.aten._local_scalar_dense.default:
        raise RuntimeError("the value of a monarch.Tensor lives on the mesh; bring a shard here with "
                           "monarch.inspect(t) or monarch.fetch_shard(t).result()")
    key = None
    if not func._schema.is_mutable:
        try:
            key = (func, tuple(inputs.sig))
            spec = _CACHE.get(key)
        except TypeError:  # an argument that cannot be hashed: no caching for this call
            key, spec = None, None
    else:
        spec = None
    if spec is None:
        spec = _propagate(func, args, kwargs, inputs)
        if key is not None:
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()
            _CACHE[key] = spec
    out_spec, mut_idx = spec
    ids: list[int | None] = []
    remotes = inputs.remotes
    result = _build(out_spec, remotes, mesh, stream, ids)
    muts = [remotes[i].ref for i in mut_idx]
    seq = client.new_seq(issuing_frames())
    client.record((CALL, mesh.op_ranks, stream.id, seq, _key(func), gargs, gkwargs, ids, muts))
    return result


def _propagate(func: Any, args: tuple, kwargs: dict, inputs: _Inputs) -> tuple:
    """Run ``func`` on meta tensors: (the result's spec, indices of the remote inputs it changed)."""
    margs = inputs.meta(args)
    mkwargs = inputs.meta(kwargs)
    if "device" in mkwargs:
        mkwargs["device"] = _META
    metas = inputs.metas
    versions = [m._version for m in metas]
    with _disable_current_modes():
        out = func(*margs, **mkwargs)
    index = {id(m): i for i, m in enumerate(metas)}

    def spec(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            i = index.get(id(x))
            if i is not None:  # an in-place op (or out=): the result is that input
                return ("in", i)
            return ("new", x.size(), x.stride(), x.dtype)
        if type(x) is tuple or type(x) is list:
            return (type(x), [spec(y) for y in x])
        if x is None:
            return None
        raise TypeError(f"{func} returns a Python value ({type(x).__name__}) that lives on the mesh; "
                        "fetch it with monarch.inspect / fetch_shard")

    out_spec = spec(out)
    spec = None  # type: ignore[assignment]  # it refers to itself: break the cycle
    return out_spec, tuple(i for i, (m, v) in enumerate(zip(metas, versions)) if m._version != v)


def _build(spec: Any, remotes: list, mesh: Any, stream: Any, ids: list) -> Any:
    if spec is None:
        return None
    kind = spec[0]
    if kind == "new":
        w = _new(spec[1], spec[2], spec[3], mesh, stream)
        ids.append(w.ref)
        return w
    if kind == "in":
        ids.append(None)
        return remotes[spec[1]]
    return kind(_build(x, remotes, mesh, stream, ids) for x in spec[1])


def call_remote(mesh: Any, key: Any, args: tuple, kwargs: dict, meta_out: Any, inputs: _Inputs | None = None,
                muts: list | None = None) -> Any:
    """Record a call of the worker-side function ``key``; its results are new tensors shaped like ``meta_out``."""
    stream = _stream.get_active_stream()
    if inputs is None:
        inputs = _Inputs()
        args, kwargs = inputs.message(args), inputs.message(kwargs)
    ids: list[int] = []

    def wrap(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            w = _new(x.shape, x.stride(), x.dtype, mesh, stream)
            ids.append(w.ref)
            return w
        if type(x) is tuple or type(x) is list:
            return type(x)(wrap(y) for y in x)
        if type(x) is dict:
            return {k: wrap(v) for k, v in x.items()}
        return x

    result = wrap(meta_out)
    wrap = None  # type: ignore[assignment]  # break its self-reference (see dispatch)
    client = mesh.client
    client.check()
    seq = client.new_seq(issuing_frames())
    client.record((CALL, mesh.op_ranks, stream.id, seq, key, args, kwargs, ids, muts or []))
    return result


# --- collectives and moves -----------------------------------------------------------------------

_REDUCTIONS = ("stack", "sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def _reduce(t: Tensor, dims: Any, reduction: str, scatter: bool, mesh: Any, inplace: bool, out: Any) -> Tensor:
    if mesh is not None:
        raise NotImplementedError("reduce(..., mesh=) is not supported; reduce, then move with to_mesh")
    if out is not None:
        raise NotImplementedError("reduce(..., out=) is not supported")
    if not isinstance(t, Tensor):
        raise TypeError(f"reduce needs a monarch.Tensor, got {type(t).__name__}")
    m = t.mesh
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    for d in dims:
        if d not in m.names:
            raise KeyError(f"dim {d!r} not found in {m!r}")
    if not dims:
        dims = m.names
    if len(set(dims)) != len(dims):
        raise ValueError(f"reducing the same dimension twice: {dims}")
    if len(dims) > 1 and (reduction == "stack" or scatter):
        raise ValueError(f"reduction {reduction} or scatter={scatter} is not valid for multiple dimensions")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} not supported, reductions are {_REDUCTIONS}")
    if t.ref is None:
        raise ValueError(f"{_EXPLAIN['DROPPED']}: {t!r}")
    stream = _stream.get_active_stream()
    if t._sid != stream.id:
        raise ValueError(f"reduce: {_EXPLAIN['STREAM']} ({t.stream}, not {stream})")
    n = m.size(dims)
    meta = t._meta
    with _disable_current_modes():
        if inplace:
            if scatter:
                raise ValueError(f"reduction {reduction} with scatter=True cannot be done in place")
            out_meta = None
        elif scatter:
            if meta.dim() == 0 or meta.size(0) != n:
                raise TypeError(f"to scatter, the outermost dim of the tensor ({list(meta.shape)}) must be the "
                                f"group size ({n})")
            out_meta = torch.empty_like(meta) if reduction == "stack" else torch.empty_like(meta[0])
        elif reduction == "stack":
            out_meta = torch.empty((n, *meta.shape), dtype=meta.dtype, device=_META)
        else:
            out_meta = torch.empty_like(meta)
    groups = _groups(m, dims)
    client = m.client
    client.check()
    client.ensure_process_group()
    r = t if inplace else Tensor(out_meta, m, stream)
    seq = client.new_seq(issuing_frames())
    client.record((REDUCE, m.op_ranks, stream.id, seq, t.ref, r.ref, groups, reduction, scatter, inplace))
    return r


def _groups(m: Any, dims: tuple) -> tuple:
    """The proc indices of each reduction group: procs that agree on every dim not reduced."""
    keep = [d for d in m.names if d not in dims]
    groups: dict[tuple, list] = {}
    for rank, c in zip(m.ranks_tuple, m.coordinates()):
        groups.setdefault(tuple(c[d] for d in keep), []).append(rank)
    return tuple(tuple(g) for g in groups.values())


def reduce(tensors: Any, dims: str | tuple = (), reduction: str = "sum", scatter: bool = False, mesh: Any = None,
           _inplace: bool = False) -> Any:
    """:meth:`Tensor.reduce` of every tensor in a pytree."""
    return _tree_map(lambda t: _reduce(t, dims, reduction, scatter, mesh, _inplace, None), tensors)


def reduce_(tensors: Any, dims: str | tuple = (), reduction: str = "sum", scatter: bool = False,
            mesh: Any = None) -> Any:
    """In-place :func:`reduce`: each tensor holds the result."""
    return reduce(tensors, dims, reduction, scatter, mesh, _inplace=True)


class MeshSliceTensor:
    """A tensor on a slice of its mesh (``t.slice_mesh(...)``), to be moved with :meth:`to_mesh`."""

    def __init__(self, tensor: Tensor, slicing: Any):
        self.tensor = tensor
        self.slicing = slicing

    def to_mesh(self, mesh: Any, stream: Any = None) -> Tensor:
        """The tensor on ``mesh``: each proc gets it from the proc of the slice at the same coordinates
        (dims the slice lacks are broadcast)."""
        mesh = getattr(mesh, "_device_mesh", mesh)
        if not hasattr(mesh, "ranks_tuple"):
            from monarch._tensor.mesh import device_mesh_of

            mesh = device_mesh_of(mesh)
        src = self.slicing
        t = self.tensor
        if mesh.client is not src.client:
            raise ValueError("to_mesh moves tensors between meshes of one proc mesh's tensor engine")
        for name in src.names:
            if name not in mesh.names:
                raise ValueError(f"dimension {name!r} of the source is not in the destination {mesh!r}")
            if src.sizes[name] != mesh.sizes[name]:
                raise ValueError(f"dimension {name!r} has {src.sizes[name]} procs in the source and "
                                 f"{mesh.sizes[name]} in the destination")
        src_by_coords = {tuple(c[n] for n in src.names): r for r, c in zip(src.ranks_tuple, src.coordinates())}
        pairs = tuple((src_by_coords[tuple(c[n] for n in src.names)], r)
                      for r, c in zip(mesh.ranks_tuple, mesh.coordinates()))
        stream = stream or t.stream
        client = mesh.client
        client.check()
        client.ensure_process_group()
        with _disable_current_modes():
            meta = torch.empty_like(t._meta, memory_format=torch.contiguous_format)
        r = Tensor(meta, mesh, stream)
        seq = client.new_seq(issuing_frames())
        ranks = frozenset(x for p in pairs for x in p)
        client.record((MOVE, ranks, stream.id, seq, t.ref, r.ref, pairs, tuple(meta.shape), meta.dtype))
        return r


def to_mesh(tensors: Any, mesh: Any, stream: Any = None) -> Any:
    """Move every tensor of a pytree to ``mesh``."""
    return _tree_map(lambda t: t.to_mesh(mesh, stream), tensors)


def slice_mesh(tensors: Any, **dims: Any) -> Any:
    """``t.slice_mesh(**dims)`` of every tensor of a pytree."""
    return _tree_map(lambda t: t.slice_mesh(**dims), tensors)


def borrow(stream: Any, t: Tensor, mutable: bool) -> tuple[Tensor, Any]:
    """``t`` usable on ``stream``: ordered after the op that made it; dropping the borrow orders back."""
    from monarch._tensor.stream import Borrow

    client = t.mesh.client
    client.check()
    made = client.new_event()
    # The lender's stream says when the tensor is ready; the borrower waits for it, then names it.
    client.record((SIGNAL, t.mesh.op_ranks, t._sid, made))
    client.record((WAIT, t.mesh.op_ranks, stream.id, made))
    r = Tensor(t._meta, t.mesh, stream)
    client.record((ALIAS, t.mesh.op_ranks, stream.id, t.ref, r.ref))

    def give_back() -> None:
        done = client.new_event()
        ref = r.ref
        r.ref = None  # its name on the borrowing stream goes now, with the borrow
        client.record((SIGNAL, t.mesh.op_ranks, stream.id, done))
        client.record((WAIT, t.mesh.op_ranks, t._sid, done))
        if ref is not None:
            client.dropped(stream.id, ref)

    return r, Borrow(give_back)


def _tree_map(fn: Any, obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return fn(obj)
    if type(obj) in (tuple, list):
        return type(obj)(_tree_map(fn, x) for x in obj)
    if type(obj) is dict:
        return {k: _tree_map(fn, v) for k, v in obj.items()}
    return obj
