"""The controller: records ops, ships them to the workers in batches, and answers fetches.

Recording an op costs the caller no round trip: it goes on a queue that a sender
thread drains, one batch per wake-up, pickled once and sent to every worker of
the mesh (each runs the ops addressed to its rank, in order).  While the sender
is busy the queue fills, so a burst of small ops leaves in a few large messages.
A fetch records its op and flushes at once, in the caller's thread.

Each op carries a *seq*; the controller keeps the stack where it was issued, so
an error raised on a worker comes back as :class:`RemoteException` naming that
place.  A proc that dies fails every fetch waiting on the mesh and every later
op with the :class:`~monarch.actor.SupervisionError` that says which and why.

Op tuples (the worker's ``_OPS`` run them): ``(code, ranks, stream, seq, ...)``,
``ranks`` None for every proc of the mesh or a frozenset of proc indices.
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from monarch_agents.errors import SupervisionError
from monarch_agents.future import Future
from monarch_agents.messages import Pickled, Reply
from monarch._tensor.worker import DELETE, FETCH, TensorWorker

#: How long the sender lets ops gather after the first one arrives (a fetch sends at once).
_BATCH_WAIT_S = 0.0005
#: How many ops' issuing stacks are kept for error reports (the oldest go first).
_TRACEBACKS_KEPT = 100_000
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SKIP = (_HERE, os.path.dirname(os.path.abspath(__import__("torch").__file__)) + os.sep, "<frozen ")


class RemoteException(Exception):
    """An op raised on a worker: where it was issued here, and the worker's traceback."""

    def __init__(self, worker_error_string: str, controller_frames: list, rank: int, seq: int = -1):
        super().__init__(worker_error_string)
        self.worker_error_string = worker_error_string
        self.controller_frames = controller_frames
        self.rank = rank
        self.seq = seq

    def __str__(self) -> str:
        where = "".join(traceback.format_list(self.controller_frames)) if self.controller_frames else \
            "  (the stack of this op is no longer kept)\n"
        return (f"a remote op failed on rank {self.rank}.\n"
                f"The op was issued here (most recent call last):\n{where}"
                f"The worker reported:\n{self.worker_error_string}")


def issuing_frames() -> list:
    """The caller's stack outside torch and this package, as FrameSummary-ready tuples (cheap)."""
    f = sys._getframe(2)
    out = []
    while f is not None and len(out) < 16:
        fn = f.f_code.co_filename
        if not fn.startswith(_SKIP):
            out.append((fn, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    out.reverse()
    return out


class _Answers:
    """A port for the answers of one fetch: one per rank asked, into one future."""

    __slots__ = ("ctl", "future", "ranks", "values", "left", "port_id", "seq", "one")

    def __init__(self, ctl: "Controller", future: Future, ranks: tuple, seq: int, one: bool):
        self.ctl = ctl
        self.future = future
        self.ranks = ranks
        self.values: dict[int, Any] = {}
        self.left = len(ranks)
        self.port_id = 0
        self.seq = seq
        self.one = one

    def deliver(self, reply: Reply) -> None:
        if not reply.ok:
            self._close()
            try:
                seq, rank, text = reply.payload.load()
            except Exception as e:
                self.future.set_exception(RuntimeError(f"a remote error could not be decoded here: {e}"))
                return
            self.future.set_exception(RemoteException(text, self.ctl.frames(seq), rank, seq))
            return
        if reply.rank not in self.values:
            self.left -= 1
        self.values[reply.rank] = reply.payload
        if self.left == 0:
            self._close()
            self.future.set_result(self.values[self.ranks[0]] if self.one else [self.values[r] for r in self.ranks])

    def lost(self, addr: str, error: SupervisionError) -> None:
        self._close()
        self.future.set_exception(self.ctl.supervision(error))

    def _close(self) -> None:
        self.ctl.rt.close_port(self.port_id)
        self.ctl.outstanding.pop(self.port_id, None)


class Controller:
    """One per proc mesh with an active tensor engine: its workers, refs, streams and queue."""

    def __init__(self, proc_mesh: Any) -> None:
        from monarch.actor import ProcMesh
        from monarch.actor._shape import Shape

        procs = proc_mesh._procs
        self.procs = procs
        self.n = len(procs)
        self.name = proc_mesh._name
        self.rt = proc_mesh._rt()
        root = ProcMesh(procs, Shape(("procs",), (self.n,)), proc_mesh._mesh_id, proc_mesh._name,
                        proc_mesh._host_mesh, False)
        self.workers = root.spawn("tensor_engine", TensorWorker, self.n)
        self._run = self.workers.run
        self._ids = itertools.count(1)
        self._seqs = itertools.count(1)
        self._events = itertools.count(1)
        self._queue: collections.deque = collections.deque()
        self._send_lock = threading.Lock()
        self._kick = threading.Event()
        self._frames: dict[int, list] = {}
        self.outstanding: dict[int, _Answers] = {}
        self.failed: SupervisionError | None = None
        self._pg_lock = threading.Lock()
        self._pg = False
        self._stopped = False
        for i, p in enumerate(procs):
            self.rt.watch(p.addr, lambda err, i=i: self._died(i, err))
        threading.Thread(target=self._sender, name="tensor-engine-sender", daemon=True).start()

    # -- ids -------------------------------------------------------------------------

    def new_ref(self) -> int:
        return next(self._ids)

    def new_event(self) -> int:
        return next(self._events)

    def new_seq(self, frames: list | None) -> int:
        seq = next(self._seqs)
        if frames is not None:
            fr = self._frames
            fr[seq] = frames
            if len(fr) > _TRACEBACKS_KEPT:
                del fr[next(iter(fr))]
        return seq

    def frames(self, seq: int) -> list:
        return [traceback.FrameSummary(f, line, name) for f, line, name in self._frames.get(seq, ())]

    # -- sending ------------------------------------------------------------------------

    def check(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self._stopped:
            raise SupervisionError(f"the tensor engine of proc mesh {self.name!r} was stopped")

    def record(self, op: tuple) -> None:
        """Queue ``op`` for the workers; the sender thread ships it (no waiting here)."""
        if self.failed is not None:
            raise self.failed
        self._queue.append(op)
        if not self._kick.is_set():
            self._kick.set()

    def dropped(self, stream: int, ref: int) -> None:
        """A controller-side tensor was collected: its remote value goes with the next batch.

        Queued like an op (after every op that used it, since those were recorded while it
        lived), without waking the sender: the next op or fetch takes it along."""
        self._queue.append((DELETE, None, stream, (ref,)))

    def flush(self) -> None:
        """Send what is queued now, in this thread."""
        with self._send_lock:
            q = self._queue
            batch = _coalesce([q.popleft() for _ in range(len(q))])
            if not batch or self.failed is not None:
                return
            try:
                self._run.broadcast(batch)
            except SupervisionError as e:
                self._died(-1, e)

    def _sender(self) -> None:
        while not self._stopped:
            self._kick.wait()
            # Let the caller go on recording for a moment: waking for every op would hand the GIL
            # back and forth per op (measured: most of an op's cost) and send batches of one.
            time.sleep(_BATCH_WAIT_S)
            self._kick.clear()
            try:
                self.flush()
            except Exception:  # never let the sender die; the next fetch reports the state
                traceback.print_exc()

    def fetch(self, ranks: tuple, stream: int, key: Any, args: tuple, kwargs: dict, *, one: bool,
              clone_inputs: bool = False, frames: list | None = None) -> Future:
        """Run ``key(*args, **kwargs)`` (or return ``args[0]``) on ``ranks`` in stream order; answer here."""
        self.check()
        raw: Future = Future()
        seq = self.new_seq(frames)
        handler = _Answers(self, raw, ranks, seq, one)
        port = self.rt.open_port(handler, [self.procs[r].addr for r in ranks])
        self.outstanding[handler.port_id] = handler
        self.record((FETCH, frozenset(ranks), stream, seq, key, args, kwargs, port, clone_inputs))
        self.flush()
        if one:
            return _mapped(raw, _load)
        return _mapped(raw, lambda ps: [_load(p) for p in ps])

    def call_workers(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` after what is queued has left (for the few control calls made directly)."""
        self.flush()
        with self._send_lock:
            return fn()

    def ensure_process_group(self) -> None:
        """The workers' gloo group over every proc of the mesh (made on the first collective)."""
        if self._pg:
            return
        with self._pg_lock:
            if self._pg:
                return
            self.check()
            host, port = self.workers.slice(procs=0).store_addr.call_one().get()
            self.call_workers(lambda: self.workers.init_pg.broadcast(host, port))
            self._pg = True

    # -- failures ------------------------------------------------------------------------

    def supervision(self, err: SupervisionError) -> SupervisionError:
        if self.failed is not None:
            return self.failed
        return SupervisionError(f"the tensor engine of proc mesh {self.name!r} failed: {err.message}",
                                rank=err.rank, host=err.host, exit_code=err.exit_code)

    def _died(self, rank: int, err: SupervisionError) -> None:
        if self.failed is not None or self._stopped:
            return
        self.failed = SupervisionError(
            f"the tensor engine of proc mesh {self.name!r} failed: proc {rank if rank >= 0 else '?'} died: "
            f"{err.message}", rank=rank if rank >= 0 else err.rank, host=err.host, exit_code=err.exit_code)
        for h in list(self.outstanding.values()):
            h._close()
            h.future.set_exception(self.failed)

    def stop(self) -> None:
        self._stopped = True
        self.workers._stopped = True  # their procs are being stopped: not a failure to report
        self._kick.set()


def _coalesce(batch: list) -> list:
    """Runs of deletions on one stream become one op (a loop that rebinds a name drops one per step)."""
    out: list = []
    for op in batch:
        if op[0] == DELETE and out and out[-1][0] == DELETE and out[-1][2] == op[2]:
            prev = out[-1]
            out[-1] = (DELETE, None, op[2], prev[3] + op[3])
        else:
            out.append(op)
    return out


def _mapped(fut: Future, fn: Callable[[Any], Any]) -> Future:
    return _Mapped(fut, fn)


class _Mapped(Future):
    """``fut`` with ``fn`` applied to its value (on the caller's thread, when it asks)."""

    def __init__(self, inner: Future, fn: Callable[[Any], Any]):
        super().__init__(fn)
        inner.add_done_callback(self._take)

    def _take(self, f: Future) -> None:
        e = f.exception()
        if e is not None:
            self.set_exception(e)
        else:
            self.set_result(f.get())


def _load(p: Pickled) -> Any:
    """A fetched value, rebuilt as local tensors even inside an active mesh's block."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return p.load()
