"""``@endpoint`` and the adverbs that message an actor mesh.

``mesh.method.call(...)`` -> Future[ValueMesh], ``call_one`` -> Future[value]
(the mesh must have exactly one actor), ``choose`` -> Future[value] from one
actor picked at random, ``stream`` -> iterator of futures in arrival order,
``broadcast`` -> None (fire and forget).
"""

from __future__ import annotations

import inspect
import random
import threading
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, TypeVar

# The descriptor lives where the proc agent that calls endpoints reads it; re-exported here.
from monarch_agents.endpoints import EndpointProperty
from monarch_agents.errors import MeshFailure, OversizedMessage, SupervisionError, actor_failed_text
from monarch_agents.future import Future
from monarch_agents.messages import Call, Pickled, PortRef, Reply
from monarch_agents import runtime
from monarch_agents.runtime import pickling_for
from monarch.actor import _telemetry
from monarch.actor._shape import Shape, ValueMesh

if TYPE_CHECKING:
    from monarch.actor._mesh import ActorMesh

R = TypeVar("R")


def endpoint(method: Callable | None = None, *, propagate: Any = None, explicit_response_port: bool = False,
             instrument: bool = True) -> Any:
    """Mark an Actor method as callable from other processes."""
    def wrap(fn: Callable) -> EndpointProperty:
        return EndpointProperty(fn, explicit_response_port=explicit_response_port, propagate=propagate)
    return wrap(method) if method is not None else wrap


def concurrent_endpoint(method: Callable | None = None, *, propagate: Any = None,
                        explicit_response_port: bool = False, instrument: bool = True) -> Any:
    """An async endpoint whose calls may overlap (each runs as its own task).

    Its running calls are cancelled, and awaited, before the actor's ``__cleanup__`` runs.
    """
    def wrap(fn: Callable) -> EndpointProperty:
        if isinstance(fn, EndpointProperty):
            raise ValueError("concurrent_endpoint does not wrap @endpoint; pass endpoint options to @concurrent_endpoint")
        if not inspect.iscoroutinefunction(fn):
            raise ValueError("concurrent_endpoint can only wrap async endpoints (it needs an `async def` method)")
        return EndpointProperty(fn, explicit_response_port=explicit_response_port, concurrent=True)
    return wrap(method) if method is not None else wrap


class _Gather:
    """Collects one answer per rank into a ValueMesh."""

    __slots__ = ("rt", "port_id", "future", "shape", "values", "left", "endpoint", "ranks_by_addr")

    def __init__(self, rt: Any, future: Future, shape: Shape, endpoint: "Endpoint | str", ranks_by_addr: dict):
        self.rt = rt
        self.port_id = 0
        self.future = future
        self.shape = shape
        self.values: list[Any] = [None] * len(shape)
        self.left = len(shape)
        self.endpoint = endpoint  # a label, or the endpoint whose label is made only if the call fails
        self.ranks_by_addr = ranks_by_addr

    @property
    def label(self) -> str:
        e = self.endpoint
        return e if isinstance(e, str) else e._label

    def deliver(self, reply: Reply) -> None:
        if not reply.ok:
            self.rt.close_port(self.port_id)
            self.future.set_exception(_load_error(reply.payload, self.rt))
            return
        if self.values[reply.rank] is None:
            self.left -= 1
        self.values[reply.rank] = reply.payload
        if self.left == 0:
            self.rt.close_port(self.port_id)
            self.future.set_result(self.values)

    def lost(self, addr: str, error: SupervisionError) -> None:
        _telemetry.bounced(self.rt)
        self.rt.close_port(self.port_id)
        self.future.set_exception(_call_failed(self.label, self.ranks_by_addr.get(addr), error, addr))


class _One:
    __slots__ = ("rt", "port_id", "future", "endpoint", "rank")

    def __init__(self, rt: Any, future: Future, endpoint: "Endpoint", rank: int | None):
        self.rt = rt
        self.port_id = 0
        self.future = future
        self.endpoint = endpoint  # its label is made only if the call fails (a str subclass each time)
        self.rank = rank

    @property
    def label(self) -> str:
        return self.endpoint._label

    def deliver(self, reply: Reply) -> None:
        self.rt.close_port(self.port_id)
        if reply.ok:
            self.future.set_result(reply.payload)
        else:
            self.future.set_exception(_load_error(reply.payload, self.rt))

    def lost(self, addr: str, error: SupervisionError) -> None:
        _telemetry.bounced(self.rt)
        self.rt.close_port(self.port_id)
        self.future.set_exception(_call_failed(self.label, self.rank, error, addr))


class _Stream:
    """Resolves futures in the order answers arrive."""

    def __init__(self, rt: Any, n: int, label: str):
        self.rt = rt
        self.port_id = 0
        self.futures = [Future(_load_value) for _ in range(n)]
        self.next = 0
        self.lock = threading.Lock()
        self.label = label

    def _take(self) -> Future | None:
        with self.lock:
            if self.next >= len(self.futures):
                return None
            f = self.futures[self.next]
            self.next += 1
            if self.next == len(self.futures):
                self.rt.close_port(self.port_id)
            return f

    def deliver(self, reply: Reply) -> None:
        f = self._take()
        if f is None:
            return
        if reply.ok:
            f.set_result(reply.payload)
        else:
            f.set_exception(_load_error(reply.payload, self.rt))

    def lost(self, addr: str, error: SupervisionError) -> None:
        _telemetry.bounced(self.rt)
        f = self._take()
        if f is not None:
            f.set_exception(_call_failed(self.label, None, error, addr))


def _load_value(payload: Any) -> Any:
    return payload.load() if isinstance(payload, Pickled) else payload


def _load_values(payloads: list) -> list:
    return [_load_value(p) for p in payloads]


def _load_error(payload: Any, rt: Any = None) -> BaseException:
    """A failure reply's error; a supervision error (the message reached no live actor: Monarch's
    undeliverable message) is also the client ``<root>``'s to handle (``_telemetry.bounced``)."""
    try:
        e = _load_value(payload)
    except Exception as err:
        return RuntimeError(f"the remote error could not be decoded here: {err}")
    if rt is not None and isinstance(e, SupervisionError):
        _telemetry.bounced(rt)
    return e if isinstance(e, BaseException) else RuntimeError(str(e))


class _Label(str):
    """An endpoint call's label (``mesh.method()``) that also knows Monarch's name of the actor at each
    proc address (``<root>.<mod.Cls mesh{'gpus': 0/2}>``), for the texts of failures."""

    names: dict

    def __new__(cls, text: str, names: dict) -> "_Label":
        label = super().__new__(cls, text)
        label.names = names
        return label

    def __reduce__(self) -> Any:
        return str, (str(self),)  # it travels (inside an error) as the plain label


def _call_failed(label: str, rank: int | None, error: SupervisionError, addr: str = "") -> SupervisionError:
    """Monarch's "Endpoint call m.f() failed, The actor ... have failed:", then why."""
    # Without a rank of the messaged slice, name the failed proc's rank in its mesh (when we own it).
    rank = rank if rank is not None else error.rank
    if isinstance(error, OversizedMessage):
        # Nothing failed but this call: say only why (Monarch's channel broke instead).
        return SupervisionError(error.message, actor=str(label), rank=rank, endpoint=str(label))
    if error.message.startswith(("The actor ", "actor mesh is stopped")):
        message = error.message  # already Monarch's words (a stopped mesh, a failed actor)
    else:
        actor = getattr(label, "names", {}).get(addr) or label.split(".")[0] + (f"[{rank}]" if rank is not None else "")
        why = (f"rank {rank}: " if rank is not None else "") + error.message
        if error.exit_code is not None and error.exit_code < 0:
            # Monarch's words for a proc killed by a signal, then ours (which proc, which signal).
            why = f"the process this actor was running on failed: Killed(sig={-error.exit_code})\n{why}"
        message = actor_failed_text(actor, why)
    return SupervisionError(message, actor=str(label), rank=rank, host=error.host, exit_code=error.exit_code,
                            endpoint=str(label))


class _Unborn(Exception):
    """A call to actors spawned on a proc mesh that never came up: its futures raise ``error``."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class Endpoint(Generic[R]):
    """``mesh.method``: the adverbs that send a message to the actors of a mesh."""

    __slots__ = ("_mesh", "_name", "_prop")

    def __init__(self, mesh: "ActorMesh", name: str, prop: EndpointProperty):
        self._mesh = mesh
        self._name = name
        self._prop = prop

    @property
    def _label(self) -> str:
        return _Label(f"{self._mesh._name}.{self._name}()", getattr(self._mesh, "_names", None) or {})

    def _send(self, args: tuple, kwargs: dict, reply: PortRef | None, shape: Shape, rt: Any = None) -> None:
        self._prop.check_args(args, kwargs)
        mesh = self._mesh
        if mesh._init_error is not None:
            raise _Unborn(mesh._init_error)
        if rt is None:
            rt = mesh._rt()
        if runtime._client_runtimes:
            with pickling_for(rt):  # a client's port in the arguments reaches this job's actors
                payload = Pickled.of((args, kwargs))
        else:  # one runtime: no port in the arguments can be another's
            payload = Pickled.of((args, kwargs))
        _telemetry.sent(rt, mesh, self._name, shape, reply)
        extent, points = shape.send_plan()
        procs, actor_id, name, addr = mesh._procs, mesh._actor_id, self._name, rt.addr
        several = bool(runtime._client_runtimes)
        for i, idx in enumerate(shape.indices):
            to = procs[idx].addr
            try:
                if to == addr or several:
                    # Perhaps to an actor in this process, which gets the message itself: copies, not the plan's.
                    rt.send(to, Call(actor_id, name, payload, dict(points[i]), dict(extent), reply, i, addr))
                else:  # to another process: pickled before send returns
                    rt.send(to, Call(actor_id, name, payload, points[i], extent, reply, i, addr))
            except SupervisionError as e:
                e.failed_addr = to  # which proc refused it: the failure names the actor there, as Monarch's
                raise

    def _targets(self, shape: Shape) -> dict:
        return {self._mesh._procs[idx].addr: i for i, idx in enumerate(shape.indices)}

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Send to every actor; the future's value is a ValueMesh of their answers."""
        shape = self._mesh._shape
        rt = self._mesh._rt()
        fut: Future = Future(lambda payloads: ValueMesh(shape, _load_values(payloads)))
        targets = self._targets(shape)
        port = rt.open_port(_Gather(rt, fut, shape, self, targets), list(targets))
        self._send_or_fail(args, kwargs, port, shape, fut, rt)
        return fut

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Send to the mesh's only actor; raises ValueError if it has more than one."""
        shape = self._mesh._shape
        if len(shape) != 1:
            raise ValueError(f"call_one requires exactly 1 actor, but mesh has {len(shape)}")
        return self._one(args, kwargs, shape)

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Send to one actor of the mesh, picked at random."""
        shape = self._mesh._shape
        i = random.randrange(len(shape))
        sub = Shape((), (), (shape.indices[i],))
        return self._one(args, kwargs, sub, "choose")

    def _one(self, args: tuple, kwargs: dict, shape: Shape, adverb: str = "call_one") -> Future:
        rt = self._mesh._rt()
        fut: Future = Future(_load_value)
        addr = self._mesh._procs[shape.indices[0]].addr
        # The rank of a one-actor slice is always 0; leave it to the error to say which proc it was.
        port = rt.open_port(_One(rt, fut, self, None), (addr,))
        self._send_or_fail(args, kwargs, port, shape, fut, rt, adverb)
        return fut

    def _undeliverable(self, error: OversizedMessage, adverb: str, shape: Shape) -> None:
        """As in Monarch, a message that could not be sent is also a supervision event of its
        sender: in the client, ``unhandled_fault_hook`` hears it (by default it ends the
        client, as Monarch's), on the runtime's thread as a proc's failure would be.  In an actor only
        its call fails (Monarch fails the sending actor)."""
        from monarch.actor._mesh import _current_ctx, _report

        if _current_ctx().actor is not None:
            return
        mesh = self._mesh
        host = mesh._procs[shape.indices[0]].host if shape.indices else ""
        failure = MeshFailure(mesh._name, 0, host, f"undeliverable message for {self._label} ({adverb}): {error.message}")
        mesh._rt().mailbox.call_soon(lambda: _report(None, failure))

    def _send_or_fail(self, args: tuple, kwargs: dict, port: PortRef, shape: Shape, fut: Future,
                      rt: Any = None, adverb: str = "call") -> None:
        try:
            self._send(args, kwargs, port, shape, rt)
        except SupervisionError as e:
            self._mesh._rt().close_port(port.port_id)
            _telemetry.bounced(self._mesh._rt())
            fut.set_exception(_call_failed(self._label, None, e, getattr(e, "failed_addr", "")))
            if isinstance(e, OversizedMessage):
                self._undeliverable(e, adverb, shape)
        except _Unborn as e:
            self._mesh._rt().close_port(port.port_id)
            fut.set_exception(e.error)
        except BaseException:
            self._mesh._rt().close_port(port.port_id)
            raise

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Send to every actor; yields one future per actor, in the order answers arrive."""
        shape = self._mesh._shape
        rt = self._mesh._rt()
        handler = _Stream(rt, len(shape), self._label)
        port = rt.open_port(handler, list(self._targets(shape)))
        try:
            self._send(args, kwargs, port, shape)
        except SupervisionError as e:
            _telemetry.bounced(rt)
            for f in handler.futures:
                f.set_exception(_call_failed(self._label, None, e, getattr(e, "failed_addr", "")))
            if isinstance(e, OversizedMessage):
                self._undeliverable(e, "stream", shape)
        except _Unborn as e:
            rt.close_port(port.port_id)
            for f in handler.futures:
                f.set_exception(e.error)
        return iter(handler.futures)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting for answers."""
        try:
            self._send(args, kwargs, None, self._mesh._shape)
        except OversizedMessage as e:
            self._undeliverable(e, "broadcast", self._mesh._shape)  # no caller to tell, as in Monarch
        except _Unborn:
            pass  # no caller to tell, as in Monarch: the failure is the proc mesh's (its initialized and stop raise it)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Under an active mesh of these actors' procs: each actor's result as a remote tensor
        (shaped by the endpoint's ``propagate``), usable in further ops at once."""
        from monarch._tensor.remote import endpoint_rref

        return endpoint_rref(self._mesh, self._name, getattr(self._prop, "propagate", None), args, kwargs)

    def _send_to_port(self, args: tuple, kwargs: dict, port: Any, selection: str) -> None:
        shape = self._mesh._shape
        if selection == "choose":
            i = random.randrange(len(shape))
            shape = Shape((), (), (shape.indices[i],))
        try:
            self._send(args, kwargs, port._ref if port is not None else None, shape)
        except _Unborn as e:
            raise e.error from None


def send(endpoint: Endpoint, args: tuple, kwargs: dict, port: Any = None, selection: str = "all") -> None:
    """Send a message to the endpoint's actors, answers (if any) going to ``port``."""
    endpoint._send_to_port(args, kwargs, port, selection)


class NotAnEndpoint:
    """``mesh.method`` for a method not marked ``@endpoint``: explains itself when called;
    ``as_endpoint(mesh.method)`` makes it callable as an endpoint."""

    def __init__(self, mesh: "ActorMesh", name: str):
        self._ref = mesh
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        cls = self._ref._class
        raise RuntimeError(
            f"Actor {cls}.{self._name} is not annotated as an endpoint. To call it as one, add a @endpoint "
            f"decorator to it, or directly wrap it in one as_endpoint(obj.method).call(...)")


def as_endpoint(not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False) -> Endpoint:
    """Call a plain (not ``@endpoint``) method of a spawned actor through the adverbs:
    ``as_endpoint(mesh.method).call(...)``."""
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError("expected an method of a spawned actor")
    mesh, name = not_an_endpoint._ref, not_an_endpoint._name
    fn = getattr(mesh._class, name)
    prop = EndpointProperty(fn, explicit_response_port=explicit_response_port, propagate=propagate)
    # The actor's side learns of the port from the name (":" is in no Python identifier).
    return Endpoint(mesh, f"port:{name}" if explicit_response_port else name, prop)


A = TypeVar("A")


class Accumulator(Generic[R, A]):
    """Fold the answers of every actor of a mesh as they arrive:
    ``Accumulator(counters.value, 0, lambda acc, x: acc + x).accumulate().get()``."""

    def __init__(self, endpoint: Endpoint[R], identity: A, combine: Callable[[A, R], A]):
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Call the endpoint on every actor now; the future's value is the fold of their answers."""
        results = list(self._endpoint.stream(*args, **kwargs))
        out: Future = Future()
        lock = threading.Lock()
        state: dict[str, Any] = {"value": self._identity, "left": len(results), "done": False}

        def one(f: Future) -> None:
            try:
                v = f.get()
            except BaseException as e:
                with lock:
                    if state["done"]:
                        return
                    state["done"] = True
                out.set_exception(e)
                return
            with lock:
                if state["done"]:
                    return
                try:
                    state["value"] = self._combine(state["value"], v)
                except BaseException as e:
                    state["done"] = True
                    out.set_exception(e)
                    return
                state["left"] -= 1
                finished = state["left"] == 0
                if finished:
                    state["done"] = True
            if finished:
                out.set_result(state["value"])

        if not results:
            out.set_result(self._identity)
        for f in results:
            f.add_done_callback(one)
        return out
