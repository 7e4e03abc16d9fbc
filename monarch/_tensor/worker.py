"""The tensor engine's worker: one actor per proc that runs what the controller recorded.

The controller sends *batches* of ops (``broadcast``, no answer), in the order it
recorded them; every worker of the mesh gets every batch and runs the ops
addressed to its rank.  Each :class:`~monarch._tensor.stream.Stream` has a thread
of its own here, so a long op on one stream does not hold up another; ops of one
stream run in order.  The actor's own thread only routes ops to their streams.

Remote tensors live in ``env``: ref id -> ``torch.Tensor`` (or a :class:`Failure`).
An op whose input failed fails its outputs with the same failure, so a fetch of
anything downstream of an error reports the op that raised (its seq), and the
rest of the mesh goes on.  Answers (fetches, remote function results) go
straight from the stream thread to the controller's port.

Collectives go through ``torch.distributed`` (gloo on CPU) over the procs of the
root mesh; the group of a reduction is made on first use, by its members only.
"""

from __future__ import annotations

import collections
import importlib
import os
import queue
import threading
import traceback
from typing import Any

from monarch.actor import Actor, endpoint

# Op codes: the first item of every op tuple (see controller.py for their fields).
CALL, FETCH, DELETE, REDUCE, MOVE, SIGNAL, WAIT, ALIAS, LEND = range(9)


class Ref:
    """A remote tensor in an op's arguments (its id in ``env``)."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = id

    def __reduce__(self) -> Any:
        return Ref, (self.id,)

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class MyRank:
    """Stands for the running proc's rank (its index among the mesh's procs) in an op's arguments."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        return MyRank, ()


class Failure:
    """What a ref holds once the op that made it raised: which op, where, and the error text."""

    __slots__ = ("seq", "rank", "text")

    def __init__(self, seq: int, rank: int, text: str):
        self.seq, self.rank, self.text = seq, rank, text


_fns: dict[str, Any] = {}


def resolve(key: Any) -> Any:
    """A function from the controller's key: ``torch.ops.aten.add.Tensor``, ``pkg.mod.fn``, or pickled bytes."""
    fn = _fns.get(key) if isinstance(key, str) else None
    if fn is not None:
        return fn
    if isinstance(key, bytes):
        import cloudpickle

        return cloudpickle.loads(key)
    first, _, rest = key.partition(".")
    if first == "torch":
        import torch

        fn = torch
        for p in rest.split("."):
            fn = getattr(fn, p)
    else:
        module, _, name = key.rpartition(".")
        obj: Any = importlib.import_module(module)
        fn = getattr(obj, name)
        fn = getattr(fn, "_remote_impl", fn)  # a @remote-decorated function: the function itself
    _fns[key] = fn
    return fn


#: This proc's worker (for remote functions that look at the engine, and tests).
current: "TensorWorker | None" = None
_ready = threading.Event()
#: Tensors lent to actors of this proc and not yet taken (a call may go to other procs only).
_LENT_KEPT = 256


class TensorWorker(Actor):
    """One per proc of a mesh with an active tensor engine."""

    def __init__(self, world: int) -> None:
        import torch

        self.torch = torch
        self.world = world
        from monarch.actor import context

        self.rank = context().actor_instance.rank.rank  # this proc's index among the mesh's procs
        self.env: dict[int, Any] = {}
        self.streams: dict[int, queue.SimpleQueue] = {}
        self.events: dict[int, threading.Event] = {}
        self.groups: dict[tuple, Any] = {}
        self.store: Any = None
        self.pg_ready = False
        self.lent: collections.OrderedDict[int, Any] = collections.OrderedDict()
        global current
        current = self
        _ready.set()
        # Procs forked from one zygote share its random state: make each draw its own numbers.
        torch.manual_seed(int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))

    # -- control -----------------------------------------------------------------

    @endpoint
    def run(self, batch: list) -> None:
        """Route a batch's ops to their streams' threads (in order, one list per stream)."""
        rank = self.rank
        cur, group = None, []
        for op in batch:
            ranks = op[1]
            if ranks is not None and rank not in ranks:
                continue
            s = op[2]
            if s != cur:
                if group:
                    self._stream(cur).put(group)
                cur, group = s, []
            group.append(op)
        if group:
            self._stream(cur).put(group)

    @endpoint
    def store_addr(self) -> tuple[str, int]:
        """Start the TCPStore that the mesh's procs rendezvous on; its (host, port)."""
        from monarch_agents import runtime

        host = runtime.current().addr.rpartition(":")[0].rpartition("/")[-1] or "127.0.0.1"
        self.store = self.torch.distributed.TCPStore(host, 0, self.world, is_master=True, wait_for_workers=False)
        return host, self.store.port

    @endpoint
    def init_pg(self, host: str, port: int) -> None:
        """Join the mesh's gloo process group (every proc of the mesh calls it)."""
        dist = self.torch.distributed
        if dist.is_initialized():
            return
        store = self.store or dist.TCPStore(host, port, self.world, is_master=False)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world)

    def _stream(self, sid: int) -> queue.SimpleQueue:
        q = self.streams.get(sid)
        if q is None:
            q = self.streams[sid] = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(q,), name=f"tensor-stream-{sid}", daemon=True).start()
        return q

    def _serve(self, q: queue.SimpleQueue) -> None:
        torch = self.torch
        with torch.no_grad():
            while True:
                for op in q.get():
                    try:
                        _OPS[op[0]](self, op)
                    except Exception:  # an op's own errors are caught below; this is a bug of ours
                        traceback.print_exc()

    # -- ops ---------------------------------------------------------------------

    def _args(self, obj: Any) -> Any:
        """``obj`` with every Ref replaced by its tensor; raises _Failed if one holds a Failure."""
        t = type(obj)
        if t is Ref:
            v = self.env.get(obj.id)
            if v is None:
                raise _Failed(Failure(-1, self.rank, f"remote tensor {obj.id} is not defined here (deleted, "
                                                     "or made on another mesh or stream)"))
            if type(v) is Failure:
                raise _Failed(v)
            return v
        if t is tuple or t is list:
            return t(self._args(x) for x in obj)
        if t is MyRank:
            return self.rank
        if t is dict:
            return {k: self._args(v) for k, v in obj.items()}
        return obj

    def _fail(self, seq: int, e: BaseException) -> Failure:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return Failure(seq, self.rank, text)

    def op_call(self, op: tuple) -> None:
        _, _, _, seq, key, args, kwargs, outs, muts = op
        env = self.env
        try:
            fn = resolve(key)
            result = fn(*self._args(args), **self._args(kwargs))
        except _Failed as f:
            failure = f.failure
        except Exception as e:
            failure = self._fail(seq, e)
        else:
            if outs:
                if len(outs) == 1 and type(result) is not tuple and type(result) is not list:
                    if outs[0] is not None:
                        env[outs[0]] = result
                else:
                    flat = _flatten(result)
                    for i, v in zip(outs, flat):
                        if i is not None:
                            env[i] = v
            return
        for i in outs:
            if i is not None:
                env[i] = failure
        for i in muts:
            env[i] = failure

    def op_fetch(self, op: tuple) -> None:
        _, _, _, seq, key, args, kwargs, port, clone_inputs = op
        from monarch_agents import runtime
        from monarch_agents.messages import Pickled, Reply

        try:
            a, k = self._args(args), self._args(kwargs)
            if clone_inputs:
                a, k = _clone(a), _clone(k)
            value = resolve(key)(*a, **k) if key is not None else a[0]
            payload, ok = Pickled.of(_detach(value)), True
        except _Failed as f:
            payload, ok = Pickled.of((f.failure.seq, f.failure.rank, f.failure.text)), False
        except Exception as e:
            fl = self._fail(seq, e)
            payload, ok = Pickled.of((fl.seq, fl.rank, fl.text)), False
        try:
            runtime.current().send(port.addr, Reply(port.port_id, self.rank, ok, payload))
        except Exception as e:  # the controller is gone
            print(f"tensor engine: could not answer the controller: {e}")

    def op_delete(self, op: tuple) -> None:
        env = self.env
        for i in op[3]:
            env.pop(i, None)

    def op_reduce(self, op: tuple) -> None:
        _, _, sid, seq, src, out, groups, reduction, scatter, inplace = op
        try:
            t = self._args(Ref(src))
            ranks = next(g for g in groups if self.rank in g)
            self.env[out] = self._reduce(t, sid, ranks, reduction, scatter, inplace)
        except _Failed as f:
            self.env[out] = f.failure
        except Exception as e:
            self.env[out] = self._fail(seq, e)
            if inplace:
                self.env[src] = self.env[out]

    def _group(self, sid: int, ranks: tuple) -> Any:
        key = (sid, ranks)
        g = self.groups.get(key)
        if g is None:
            dist = self.torch.distributed
            if len(ranks) == self.world and sid == 0:
                g = dist.group.WORLD
            else:
                g = dist.new_group(list(ranks), backend="gloo", use_local_synchronization=True)
            self.groups[key] = g
        return g

    def _reduce(self, t: Any, sid: int, ranks: tuple, reduction: str, scatter: bool, inplace: bool) -> Any:
        torch = self.torch
        dist = torch.distributed
        n = len(ranks)
        me = ranks.index(self.rank)
        group = self._group(sid, ranks)
        if reduction == "stack":
            parts = [torch.empty_like(t) for _ in range(n)]
            dist.all_gather(parts, t.contiguous(), group=group)
            if scatter:  # all-to-all: my slice of every rank's tensor
                return torch.stack([p[me] for p in parts])
            return torch.stack(parts)
        op = _REDUCE_OPS[reduction]
        buf = t if inplace else t.clone()
        if not buf.is_contiguous():
            tmp = buf.contiguous()
            dist.all_reduce(tmp, op=getattr(dist.ReduceOp, op), group=group)
            buf.copy_(tmp)
        else:
            dist.all_reduce(buf, op=getattr(dist.ReduceOp, op), group=group)
        if reduction == "avg":
            if buf.is_floating_point() or buf.is_complex():
                buf.div_(n)
            else:
                buf.floor_divide_(n)
        if scatter:
            return buf[me]
        return buf

    def op_move(self, op: tuple) -> None:
        """Send a tensor from the procs of one mesh to those of another (pairs of root ranks)."""
        _, _, sid, seq, src, out, pairs, shape, dtype = op
        torch = self.torch
        dist = torch.distributed
        try:
            works, result = [], None
            value = None
            for s, d in pairs:
                if s == self.rank:
                    if value is None:
                        value = self._args(Ref(src)).contiguous()
                    if d == self.rank:
                        result = value.clone()
                    else:
                        works.append(dist.isend(value, d))
                elif d == self.rank:
                    result = torch.empty(shape, dtype=dtype)
                    works.append(dist.irecv(result, s))
            for w in works:
                w.wait()
            if result is not None:
                self.env[out] = result
        except _Failed as f:
            self.env[out] = f.failure
        except Exception as e:
            self.env[out] = self._fail(seq, e)

    def op_signal(self, op: tuple) -> None:
        self._event(op[3]).set()

    def op_wait(self, op: tuple) -> None:
        ev = self._event(op[3])
        ev.wait()
        self.events.pop(op[3], None)

    def _event(self, eid: int) -> threading.Event:
        ev = self.events.get(eid)
        if ev is None:
            ev = self.events.setdefault(eid, threading.Event())
        return ev

    def op_lend(self, op: tuple) -> None:
        """A tensor sent to an actor: set it aside as it is at this point of the stream."""
        lent = self.lent
        lent[op[3]] = self.env.get(op[4])
        while len(lent) > _LENT_KEPT:
            lent.popitem(last=False)
        self._event(op[3]).set()

    def op_alias(self, op: tuple) -> None:
        """A borrow: ``out`` names the same tensor as ``src`` (on the borrowing stream)."""
        v = self.env.get(op[3])
        self.env[op[4]] = v if v is not None else Failure(-1, self.rank, f"remote tensor {op[3]} was not defined")


class _Failed(Exception):
    def __init__(self, failure: Failure):
        self.failure = failure


_OPS = {
    CALL: TensorWorker.op_call, FETCH: TensorWorker.op_fetch, DELETE: TensorWorker.op_delete,
    REDUCE: TensorWorker.op_reduce, MOVE: TensorWorker.op_move, SIGNAL: TensorWorker.op_signal,
    WAIT: TensorWorker.op_wait, ALIAS: TensorWorker.op_alias, LEND: TensorWorker.op_lend,
}

_REDUCE_OPS = {"sum": "SUM", "avg": "SUM", "product": "PRODUCT", "min": "MIN", "max": "MAX", "band": "BAND",
               "bor": "BOR", "bxor": "BXOR"}


def _flatten(result: Any) -> list:
    out: list = []

    def walk(x: Any) -> None:
        if type(x) is tuple or type(x) is list:
            for y in x:
                walk(y)
        elif type(x) is dict:
            for y in x.values():
                walk(y)
        elif hasattr(x, "dtype") and hasattr(x, "shape"):
            out.append(x)

    walk(result)
    return out


def _clone(obj: Any) -> Any:
    if hasattr(obj, "clone") and hasattr(obj, "dtype"):
        return obj.clone()
    if type(obj) in (tuple, list):
        return type(obj)(_clone(x) for x in obj)
    if type(obj) is dict:
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _detach(obj: Any) -> Any:
    """A fetched value as it is now: tensors copied if a later op could change them before they leave."""
    if hasattr(obj, "detach") and hasattr(obj, "dtype"):
        t = obj.detach()
        return t.clone() if t.nbytes >= 64 * 1024 or not t.is_contiguous() else t
    if type(obj) in (tuple, list):
        return type(obj)(_detach(x) for x in obj)
    if type(obj) is dict:
        return {k: _detach(v) for k, v in obj.items()}
    return obj


def describe(fn_key: Any, *args: Any, **kwargs: Any) -> Any:
    """For propagation by running: call the function here on copies, and say what its outputs look like."""
    result = resolve(fn_key)(*args, **kwargs)
    return _shapes(result)


def _shapes(x: Any) -> Any:
    if hasattr(x, "dtype") and hasattr(x, "shape"):
        return ("tensor", tuple(x.shape), x.dtype)
    if type(x) in (tuple, list):
        return type(x)(_shapes(y) for y in x)
    if type(x) is dict:
        return {k: _shapes(v) for k, v in x.items()}
    return x


def send_to_port(fn_key: Any, port: Any, ranks: dict, rank: int, *args: Any, **kwargs: Any) -> None:
    """``send(remote_fn, args, kwargs, port)`` on one proc: run the function and send what it returns
    (or raises) to ``port``, under this proc's rank in the mesh it was sent to."""
    from monarch_agents.ports import Port

    to = Port(port._ref, ranks[rank])
    try:
        result = resolve(fn_key)(*args, **kwargs)
    except Exception as e:
        to.exception(e)
        return
    to.send(result)


def rank_value(table: dict, rank: int) -> Any:
    """This proc's entry of ``table`` (its coordinate along some mesh dims), as a 0-d long tensor."""
    import torch

    return torch.tensor(table[rank], dtype=torch.long)


#: How long an actor waits for the ops that make a tensor it was sent.
_SHARD_WAIT_S = 600.0


def local_shard(ref: int, made: int) -> Any:
    """A remote tensor passed to an actor, as this proc holds it (after the ops that make it)."""
    _ready.wait(_SHARD_WAIT_S)  # the worker may still be starting
    w = current
    if w is None:
        raise RuntimeError("a monarch.Tensor was sent to an actor on a proc without its tensor engine: actors "
                           "receive tensors of the mesh they run on")
    ev = w._event(made)
    if not ev.wait(_SHARD_WAIT_S):
        raise TimeoutError(f"remote tensor {ref} was not made here within {_SHARD_WAIT_S:.0f} s")
    w.events.pop(made, None)
    v = w.lent.pop(made, None)
    if v is None:
        raise RuntimeError(f"remote tensor {ref} is not defined on this proc (deleted, or made on another mesh)")
    if type(v) is Failure:
        raise RuntimeError(f"the remote tensor sent here failed to compute:\n{v.text}")
    return v


def call_actor(actor_id: str, name: str, procs: dict, method: str, args: tuple, kwargs: dict, rank: int) -> Any:
    """``endpoint.rref`` on this proc: call this proc's actor of the mesh and wait for its answer."""
    from monarch_agents import runtime
    from monarch_agents.messages import Call, Pickled

    from monarch_agents.future import Future
    from monarch_agents.runtime import OneShot

    rt = runtime.current()
    addr = procs.get(rank)
    if addr is None:
        raise RuntimeError(f"actor mesh {name!r} has no actor on proc {rank}")
    fut: Future = Future()
    port = rt.open_port(OneShot(rt, fut), [addr])
    rt.send(addr, Call(actor_id, method, Pickled.of((args, kwargs)), {}, {}, port, 0, rt.addr))
    value = fut.get(timeout=_SHARD_WAIT_S)
    return value.load() if isinstance(value, Pickled) else value
