"""Host, proc and actor meshes: the objects a monarch program holds.

``this_host().spawn_procs(per_host={"gpus": 4})`` asks the host agent(s) for
procs and returns a ``ProcMesh``; ``procs.spawn("name", Cls, *args)`` starts one
actor per proc and returns an ``ActorMesh`` whose endpoints can be called.
The process that spawns a mesh owns it: it is told when a proc dies, and
when it exits, its procs are reaped by their host agents.

As in Monarch, ``spawn`` returns at once: calls queue behind each actor's
``__init__``, and an ``__init__`` that raises is a supervision event for the
mesh's owner (``__supervise__``, or ``unhandled_fault_hook`` in the client);
calls to that actor then raise ``SupervisionError``.  ``await mesh.initialized``
waits for every ``__init__``.  The meshes an actor makes are stopped with it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from monarch_agents import messages as m
from monarch_agents import supervision
from monarch_agents import names as _names
from monarch_agents.context import ROOT as _ROOT_CTX, current as _current_ctx
from monarch_agents.errors import MeshFailure, SupervisionError, actor_failed_text
from monarch_agents.future import Future
from monarch_agents.proc_agent import ENV_UNSET, actor_kind, current_agent, endpoint_spec, host_actors_in_client
from monarch_agents.proc_agent import _qualname
from monarch_agents import proc_agent as _proc_agent
from monarch_agents import debug_rank as _debug_rank
from monarch_agents import wire as _wire
from monarch_agents.runtime import Runtime
from monarch_agents.runtime import claim as rt_claim
from monarch_agents.runtime import for_peer as rt_for_peer
from monarch_agents.runtime import pickling_for as rt_pickling_for
from monarch import config as _config
from monarch.actor import _ids, _mock, _telemetry
from monarch.actor._client import (ROOT_ENV, SYS_PATH_ENV, HostRef, ensure_runtime, env_changes, local_host,
                                   refresh_local_stdio, user_sys_path)
from monarch.actor._endpoint import Endpoint, NotAnEndpoint, _Gather, endpoint
from monarch.actor._shape import Extent, Point, Shape
from monarch.actor import _ndslice as _nd

if TYPE_CHECKING:
    from monarch._rust_bindings.monarch_hyperactor.shape import Region, Slice, Shape as MonarchShape
from monarch.actor._pytokio import PythonTask, Shared

T = TypeVar("T")
log = logging.getLogger("monarch.actor")
_mesh_ids = itertools.count()
_logging_lock = threading.Lock()


def _stop_actor_wait_s() -> float:
    # A proc stopping its actors waits as its client's stop_actor_timeout says (inherited at spawn).
    try:
        return _config.seconds("stop_actor_timeout")
    except ValueError as e:  # a bad value in this proc's environment must not keep it from stopping
        log.warning("%s; stopping waits 5 s for each actor", e)
        return 5.0


_proc_agent.child_stop_s = _stop_actor_wait_s


class Actor:
    """Base class of actors. Endpoints are methods marked with ``@endpoint``."""

    @property
    def _monarch_info(self) -> Any:
        return getattr(self, "_monarch_slot", None)

    def _handle_undeliverable_message(self, message: Any) -> bool:
        """A message this actor sent came back undelivered (``PortRef.send``); True: handled.
        As in Monarch, by default it is not, and the actor fails."""
        return False

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class, at DEBUG; its lines carry the actor's name."""
        lgr = logging.getLogger(type(self).__name__)
        lgr.setLevel(logging.DEBUG)
        return lgr


def _add_child(mesh: Any) -> None:
    """Inside an actor, remember a mesh it made: stopping the actor stops it too."""
    actor = _current_ctx().actor
    if actor is not None and actor.slot is not None:
        actor.slot.children.append(mesh)


def _client_proc(rt: Runtime) -> None:
    """Let the client host actors too (``this_proc().spawn``, controllers), once; the root client's
    controllers actor answers its procs' first ``get_or_spawn_controller`` (and a ``breakpoint()``
    asking for Monarch's debugger actor) even if the client never asked for one itself."""
    if current_agent() is None:
        host_actors_in_client(rt)
        if not os.environ.get(ROOT_ENV):
            _controllers_mesh()  # registers it, to start on its first message


class _MeshBase:
    _shape: Shape

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    @property
    def sizes(self) -> dict:
        return dict(zip(self._shape.labels, self._shape.sizes))

    def size(self, dim: str | None = None) -> int:
        return len(self._shape) if dim is None else self.sizes[dim]

    def __len__(self) -> int:
        return len(self._shape)

    @property
    def _labels(self) -> tuple[str, ...]:
        return tuple(self._shape.labels)

    def _rt(self) -> Runtime:
        # The runtime of the job this mesh belongs to (a client may hold meshes of several).
        return rt_for_peer(self._first_addr()) or ensure_runtime()

    def _first_addr(self) -> str:
        return ""


def _proc_death_reason(err: SupervisionError, actors: list[str] | None) -> str:
    """A dead proc's failure as Monarch words it, the failure of the first actor it ran ("The actor
    <root>.<mod.Cls name{'gpus': 0/2}> and all its descendants have failed: the process this actor was
    running on failed: Killed(sig=9)"), then ours (which proc, its pid, how it ended)."""
    if not actors:
        return str(err)
    why = str(err)
    if err.exit_code is not None and err.exit_code < 0:
        why = f"the process this actor was running on failed: Killed(sig={-err.exit_code})\n{why}"
    return actor_failed_text(actors[0], why)


def _report(owner_actor: Any, failure: MeshFailure) -> None:
    """To the owning actor's ``__supervise__``, else to ``monarch.actor.unhandled_fault_hook`` (looked up
    at each failure: a program may replace it)."""
    import monarch.actor as api

    supervision.report(owner_actor, failure, api.unhandled_fault_hook)


#: What ``monarch._src.actor.proc_mesh.register_proc_mesh_spawn_callback`` registered: each is called
#: with every proc mesh ``spawn_procs`` returns in this process, in registration order.
_spawn_callbacks: list[Callable[["ProcMesh"], None]] = []
#: Every proc mesh ``spawn_procs`` returned in this process and not yet collected (Monarch's
#: ``get_active_proc_meshes``, which flushes their logs after each IPython cell, lists the unstopped ones).
_spawned_proc_meshes: "weakref.WeakSet[ProcMesh]" = weakref.WeakSet()


class HyHostMesh:
    """What Monarch's runtime holds of a host mesh (its native ``HostMesh``): the host agents, the
    region of them the mesh names, and the interpreter its procs run (None: the agents' own)."""

    def __init__(self, hosts: list[HostRef], shape: Shape, python_exe: str | None = None):
        self._all = hosts
        self._shape = shape
        self.python_exe = python_exe

    @property
    def hosts(self) -> list[HostRef]:
        return [self._all[i] for i in self._shape.indices]

    @property
    def region(self) -> Region:
        return _nd.region_of(self._shape)

    def sliced(self, shape: Shape) -> "HyHostMesh":
        return HyHostMesh(self._all, shape, self.python_exe)

    def __repr__(self) -> str:
        return f"HyHostMesh({self.region!r})"


class HostMesh(_MeshBase):
    """One or more hosts with a monarch host agent on each."""

    #: Set by shutdown(): a shut-down mesh spawns nothing more (a class default: older pickles lack it).
    _shut_down: bool = False
    #: Hosts of ``attach_to_workers``: ``shutdown()`` ends their agents too.
    _workers: bool = False
    #: A copy received from another process (unpickled): it may not shut the hosts down.
    _reference: bool = False

    def __init__(self, hosts: list[HostRef], shape: Shape | None = None, python_exe: str | None = None):
        self._hosts = list(hosts)
        self._shape = shape or (Shape(("hosts",), (len(hosts),)) if len(hosts) > 1 else Shape((), (), (0,)))
        # The mesh as Monarch's runtime holds it (its ``HyHostMesh``): which hosts, what region of
        # them, how procs start there.  spawn_procs reads its hosts from it; shutdown drops it.
        self._inner_host_mesh: Shared[HyHostMesh] | None = Shared.from_value(
            HyHostMesh(self._hosts, self._shape, python_exe))

    def slice(self, **dims: Any) -> "HostMesh":
        return self._new_with_shape(self._shape.slice(**dims))

    def _new_with_shape(self, shape: "Shape | MonarchShape") -> "HostMesh":
        """This mesh cut to ``shape`` (Monarch's: labels over a slice of the hosts), a reference:
        as in Monarch, a slice may not shut the hosts down.  If the native mesh is still pending,
        so is the slice's."""
        cut = _nd.as_mesh_shape(shape)
        hy = self._hy_host_mesh
        sub = HostMesh.__new__(HostMesh)
        sub._hosts, sub._shape, sub._reference = self._hosts, cut, True
        sub.__dict__["_spawned"] = self.__dict__.setdefault("_spawned", [])  # the owner's shutdown stops what a slice spawned
        done = hy.poll()
        if done is not None:
            sub._inner_host_mesh = Shared.from_value(done.sliced(cut))
        else:
            async def sliced() -> HyHostMesh:
                return (await hy).sliced(cut)

            sub._inner_host_mesh = PythonTask.from_coroutine(sliced()).spawn()
        return sub

    def _identity(self) -> tuple:
        return (tuple(h.addr for h in self.hosts), tuple(self._shape.labels), tuple(self._shape.sizes))

    def __eq__(self, other: object) -> bool:
        """The same hosts in the same arrangement, as Monarch compares host meshes (so an actor's
        ``this_host()`` equals the client's slice of that host)."""
        if not isinstance(other, HostMesh):
            return NotImplemented
        return self._identity() == other._identity()

    #: As Monarch's: equal by value, so not hashable.
    __hash__ = None  # type: ignore[assignment]

    @property
    def _hy_host_mesh(self) -> "Shared[HyHostMesh]":
        inner = self.__dict__.get("_inner_host_mesh")
        if inner is None:
            raise RuntimeError("HostMesh has already been shut down")
        return inner

    @property
    def region(self) -> Region:
        """The hosts this mesh names, as Monarch's ``Region`` of the hosts it was cut from."""
        return _nd.region_of(self._shape)

    @property
    def _ndslice(self) -> Slice:
        return self.region.slice()

    @property
    def stream_logs(self) -> bool:
        """False: proc output reaches the client through the host agents, not streamed by the mesh
        (Monarch's ``stream_logs`` of a job's mesh; see README, logs)."""
        return False

    @property
    def hosts(self) -> list[HostRef]:
        return [self._hosts[i] for i in self._shape.indices]

    def _first_addr(self) -> str:
        return self._hosts[0].addr if self._hosts else ""

    @property
    def is_fake_in_process(self) -> bool:
        """False: every monarch host mesh is real host agents (Monarch's fake in-process hosts, which run
        procs inside the client for tests, are not made here)."""
        return False

    @property
    def initialized(self) -> Future:
        """True once the hosts are up; raises why they are not (an attach that failed)."""
        inner = self.__dict__.get("_inner_host_mesh")
        if inner is None:
            return Future.completed(True)

        async def ready() -> bool:
            await inner
            return True

        return Future._from_coro(ready())

    def spawn_procs(self, per_host: dict[str, int] | None = None, bootstrap: Callable[[], Any] | None = None,
                    name: str | None = None, proc_bind: list[dict[str, str]] | None = None,
                    bootstrap_command: Any = None) -> "ProcMesh":
        """Start ``prod(per_host)`` procs on each host; their mesh has the host dims then ``per_host``'s.

        ``proc_bind`` (one dict per proc of a host) pins each proc to CPUs: ``cpus`` or
        ``physcpubind`` (``"0-3,8"``), or ``cpunodebind`` (the CPUs of those NUMA nodes);
        ``membind`` is accepted and not applied (monarch does not set memory policy).

        ``bootstrap_command`` (a ``BootstrapCommand``, or a function of each proc's ``Point`` over
        the host and ``per_host`` dims returning one) sets that proc's environment and interpreter,
        for this spawn only (see ``_hostmesh_extras.bootstrap_plans``).
        """
        _hostmesh_extras.check_usable(self)
        per_host = dict(per_host or {})
        for k in per_host:
            if k in self._shape.labels:
                raise ValueError(f"per_host dimension {k!r} is already a host dimension")
        count = 1
        for v in per_host.values():
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"per_host sizes must be positive integers, got {per_host}")
            count *= v
        if proc_bind is not None:
            _hostmesh_extras.check_proc_bind(proc_bind, count)
        spawn_timeout = _config.seconds("mesh_proc_spawn_max_idle")  # a bad value fails here, before any spawn
        rt = self._rt()
        mesh_name = name or "procs"
        mesh_id = f"{mesh_name}-{os.getpid()}-{next(_mesh_ids)}-{uuid.uuid4().hex[:6]}"
        preload = tuple(mod for mod in ("torch", "numpy") if mod in __import__("sys").modules)
        # Procs are forked from a zygote whose sys.path was fixed when it started: hand them
        # ours, so what we import by name (a module next to the script) imports there too.
        _client_proc(rt)
        # As in Monarch, procs see this process's environment as it is now (what changed
        # since the host agent started), not only as it was when the agent started.
        env, unset = env_changes()
        env[SYS_PATH_ENV] = os.pathsep.join(user_sys_path())
        env[ROOT_ENV] = os.environ.get(ROOT_ENV) or rt.addr
        env[_config.INHERIT_ENV] = _config.for_procs()  # as in Monarch, procs see our settings as they are now
        if unset:
            env[ENV_UNSET] = ",".join(unset)
        refresh_local_stdio(rt)
        futures = []
        hy = self._hy_host_mesh.block_on()  # as in Monarch, a spawn waits for its host mesh
        hosts = hy.hosts
        plans = _hostmesh_extras.bootstrap_plans(bootstrap_command, hy, per_host, count)
        # What this_host() is inside the procs: their own host, within the hosts it was cut from.
        env[_hostmesh_extras.HOST_MESH_ENV] = _hostmesh_extras.host_mesh_env(hy)
        orphan_s = _config.limit("mesh_orphan_timeout")  # how long they outlive us, should we die
        for pos, h in enumerate(hosts):
            host_env = {**env, _hostmesh_extras.HOST_INDEX_ENV: str(hy._shape.indices[pos])}
            per_proc = plans[pos * count:(pos + 1) * count] if plans is not None else None

            def ask(port: m.PortRef, host_env: dict = host_env, per_proc: list | None = per_proc) -> m.SpawnProcs:
                return m.SpawnProcs(mesh_id, count, rt.addr, port, host_env, preload, orphan_s=orphan_s,
                                    per_proc=per_proc)
            futures.append(rt.request(h.addr, ask))
        procs: list[m.ProcInfo] = []
        for h, f in zip(hosts, futures):
            try:
                procs.extend(f.get(timeout=spawn_timeout))
            except TimeoutError:
                raise SupervisionError(f"host {h.host} did not start {count} procs within {spawn_timeout:g} s") from None
        # These procs are this job's: what this client sends them goes through its runtime.
        rt_claim(rt, [p.addr for p in procs])
        shape = Shape((*self._shape.labels, *per_host), (*self._shape.sizes, *per_host.values()))
        pm = ProcMesh(procs, shape, mesh_id, mesh_name, self, owner=True)
        _telemetry.proc_mesh(rt, self, mesh_id, mesh_name, shape, procs)
        pm._watch(_current_ctx().actor)
        _add_child(pm)
        if bootstrap is not None:
            try:
                pm.spawn("bootstrap", _Bootstrap, bootstrap).run.call().get()
            except Exception as e:
                # As in Monarch, spawn_procs returns; the failure is what pm.initialized (and a spawn) raises.
                pm._init_error = e
        if proc_bind is not None:
            _hostmesh_extras.bind_procs(pm, proc_bind, count)
        _hostmesh_extras.remember(self, pm)
        _spawned_proc_meshes.add(pm)
        for callback in list(_spawn_callbacks):
            callback(pm)
        return pm

    def _check_owned(self, verb: str) -> None:
        if self.__dict__.get("_reference"):
            raise RuntimeError(f"cannot {verb} `HostMesh` that is a reference instead of owned "
                               "(it was sent here from another process, or cut from its owner by slicing: the owner may)")

    def shutdown(self) -> Future:
        """Stop every proc this mesh object spawned; the object is unusable afterwards.

        The hosts themselves stay reserved (``job.kill()`` or ``monarch stop`` releases them),
        where Monarch's ``shutdown`` ends the host processes.
        """
        self._check_owned("shut down")
        return _hostmesh_extras.stop_spawned(self, final=True)

    def stop(self) -> Future:
        """Stop every proc this mesh object spawned; the hosts stay usable for new procs."""
        self._check_owned("stop")
        return _hostmesh_extras.stop_spawned(self, final=False)

    def with_python_executable(self, python_executable: str) -> "HostMesh":
        """This mesh, for procs that run ``python_executable`` (see ``_hostmesh_extras``)."""
        return _hostmesh_extras.with_python_executable(self, python_executable)

    def __enter__(self) -> "HostMesh":
        _hostmesh_extras.check_usable(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not getattr(self, "_shut_down", False):
            self.shutdown().get()

    async def __aenter__(self) -> "HostMesh":
        _hostmesh_extras.check_usable(self)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not getattr(self, "_shut_down", False):
            await self.shutdown()

    def __getstate__(self) -> dict:
        # What a host mesh sent to an actor names: the hosts, not this client's proc bookkeeping;
        # as in Monarch, the copy is a reference, which may not shut the hosts down, and pickling
        # a mesh whose native mesh is still pending waits for it.
        inner = self.__dict__.get("_inner_host_mesh")
        return {"_hosts": self._hosts, "_shape": self._shape, "_reference": True,
                "_hy": inner.block_on() if inner is not None else None}

    def __setstate__(self, state: dict) -> None:
        hy = state.pop("_hy", None) or HyHostMesh(state["_hosts"], state["_shape"])
        self.__dict__.update(state)
        self._inner_host_mesh = Shared.from_value(hy)

    def __repr__(self) -> str:
        return f"HostMesh({self.extent}, hosts={[h.host for h in self.hosts]})"


class _Bootstrap(Actor):
    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    @endpoint
    def run(self) -> None:
        r = self.fn()
        if hasattr(r, "__await__"):
            import asyncio

            asyncio.run(r)


def _check_endpoint_names(cls: type) -> None:
    """As Monarch: an endpoint named like an attribute of ActorMesh (``stop``, ``slice``, ``size``...)
    would be hidden by it on the mesh, so the spawn is refused."""
    for name in dir(cls):
        if name.startswith("_") or not hasattr(ActorMesh, name):
            continue
        spec = endpoint_spec(cls, name)
        if spec is not None:
            raise ValueError(f"ActorMesh has an attribute that collides with an endpoint name: attribute={name}, "
                             f"ActorMesh.{name}={getattr(ActorMesh, name)!r}, endpoint={spec!r} "
                             f"(rename the endpoint {cls.__name__}.{name})")


class _MockSetup(Actor):
    """Installs the spawner's ``patch_actor`` patches in a proc."""

    def __init__(self, state: dict):
        _mock.set_registry_state(state)


class HyProcMesh:
    """What Monarch's runtime holds of a proc mesh (its native ``ProcMesh``): the procs, and the
    region of them a mesh names."""

    def __init__(self, procs: list[m.ProcInfo], shape: Shape):
        self._procs = procs
        self._shape = shape

    @property
    def region(self) -> Region:
        return _nd.region_of(self._shape)

    def sliced(self, shape: Shape) -> "HyProcMesh":
        return HyProcMesh(self._procs, shape)

    def __repr__(self) -> str:
        return f"HyProcMesh({self.region!r})"


class ProcMesh(_MeshBase):
    """Procs started on one or more hosts; spawn actors on them with :meth:`spawn`."""

    def __init__(self, procs: list[m.ProcInfo], shape: Shape, mesh_id: str, name: str,
                 host_mesh: HostMesh | None = None, owner: bool = False):
        self._procs = procs
        self._shape = shape
        self._mesh_id = mesh_id
        self._name = name
        self._host_mesh = host_mesh
        self._owner = owner
        self._owner_actor: Any = None  # who is told of its procs' deaths (None: the client)
        self._stopped = False
        # Monarch's names of the actors spawned on each proc (by address), shared with slices: a
        # proc's death is reported, as in Monarch, as the failure of the actors it ran.
        self._actors_on: dict[str, list[str]] = {}
        # The actor meshes this mesh's owner spawned on it (shared with slices), each with its rank
        # on each proc: as in Monarch, a proc's death fails each of them, and the owner hears of
        # each, under that actor mesh's name.
        self._own_meshes: list[tuple["ActorMesh", dict[str, int]]] = []
        # The mesh as Monarch's runtime holds it (its ``HyProcMesh``): the procs up, and the region
        # of them this mesh names.  Ours is up when spawn_procs returns.
        self._proc_mesh: Shared[HyProcMesh] = Shared.from_value(HyProcMesh(procs, shape))

    def _first_addr(self) -> str:
        return self._procs[0].addr if self._procs else ""

    def __reduce__(self) -> Any:
        # A slice stays a slice in another process (it may not stop the whole mesh there either).
        # As in Monarch, sending a mesh whose native mesh is still pending waits for it.
        hy = self.__dict__["_proc_mesh"].block_on() if "_proc_mesh" in self.__dict__ else None
        procs, shape = (hy._procs, hy._shape) if hy is not None else (self._procs, self._shape)
        return ProcMesh, (procs, shape, self._mesh_id, self._name, self._host_mesh, False), \
            {"_slice_of": self._slice_of, "_init_error": self._init_error}

    @property
    def _region(self) -> Region:
        """The procs this mesh names, as Monarch's ``Region`` of the mesh it was cut from."""
        return _nd.region_of(self._shape)

    @property
    def _ndslice(self) -> Slice:
        return self._region.slice()

    @property
    def _labels(self) -> list[str]:  # type: ignore[override]  # Monarch's proc mesh labels are a list
        return list(self._shape.labels)

    def _new_with_shape(self, shape: "Shape | MonarchShape") -> "ProcMesh":
        """This mesh cut to ``shape`` (Monarch's: labels over a slice of its procs); if the native
        mesh is still pending, so is the slice's."""
        cut = _nd.as_mesh_shape(shape)
        sub = self._sliced(cut)
        hy = self._proc_mesh
        done = hy.poll()
        if done is not None:
            sub._proc_mesh = Shared.from_value(done.sliced(cut))
        else:
            async def sliced() -> HyProcMesh:
                return (await hy).sliced(cut)

            sub._proc_mesh = PythonTask.from_coroutine(sliced()).spawn()
        return sub

    @property
    def host_mesh(self) -> HostMesh | None:
        return self._host_mesh

    #: Why this mesh failed to come up (its ``bootstrap`` raised), else None (a class default: older pickles lack it).
    _init_error: BaseException | None = None

    @property
    def initialized(self) -> Future:
        """True once the procs are up; a mesh whose setup failed raises that failure instead.

        As in Monarch, every observer hears the outcome, however late it asks and whether or
        not an earlier one was awaited or dropped: each call is a new future of the same result.
        """
        if self._init_error is not None:
            fut: Future = Future()
            fut.set_exception(self._init_error)
            return fut
        return Future.completed(True)

    def slice(self, **dims: Any) -> "ProcMesh":
        return self._new_with_shape(self._shape.slice(**dims))

    def flatten(self, name: str) -> "ProcMesh":
        """The same procs along one dimension called ``name`` (row-major), as Monarch's
        ``procs.flatten("rank").slice(rank=0)``."""
        return self._new_with_shape(self._shape.flatten(name))

    def _sliced(self, shape: Shape) -> "ProcMesh":
        sub = ProcMesh(self._procs, shape, self._mesh_id, self._name, self._host_mesh, False)
        # A slice is still ours: its procs' deaths already reach the owner through the whole mesh.
        sub._owner, sub._owner_actor = self._owner, self._owner_actor
        sub._slice_of = self._name
        sub._init_error = self._init_error
        sub._actors_on = self._actors_on
        sub._own_meshes = self._own_meshes
        return sub

    def _watch(self, owner_actor: Any) -> None:
        self._owner_actor = owner_actor
        rt = self._rt()
        for i, idx in enumerate(self._shape.indices):
            p = self._procs[idx]
            rt.own(p.addr, {"what": f"proc {self._name}[{i}] (pid {p.pid})", "rank": i, "host": p.host})

            def on_death(err: SupervisionError, rank: int = i, host: str = p.host, addr: str = p.addr) -> None:
                if self._stopped:
                    return
                failed = [(mesh, ranks[addr]) for mesh, ranks in self.__dict__.get("_own_meshes", ())
                          if addr in ranks and not mesh._stopped]
                for mesh, mesh_rank in failed:
                    reason = _proc_death_reason(err, [mesh._names[addr]] if addr in mesh._names else None)
                    _report(owner_actor, MeshFailure(mesh._name, mesh_rank, host, reason, err.exit_code))
                if not failed:
                    # No actor mesh of the owner's ran there: the proc mesh's own failure.
                    reason = _proc_death_reason(err, self.__dict__.get("_actors_on", {}).get(addr))
                    _report(owner_actor, MeshFailure(self._name, rank, host, reason, err.exit_code))
            rt.watch(p.addr, on_death)

    def spawn(self, name: str, cls: type[T], *args: Any, **kwargs: Any) -> "ActorMesh[T]":
        """Start one ``cls(*args, **kwargs)`` per proc and return at once.

        Calls made now queue behind each ``__init__``; ``await mesh.initialized`` waits for
        them.  An ``__init__`` that raises is a supervision event for the caller (its
        ``__supervise__``, or ``unhandled_fault_hook`` in the client), and calls to that
        actor raise ``SupervisionError``.
        """
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise ValueError(f"{cls!r} is not an Actor subclass")
        cls = _mock.actor_class(cls)  # monarch._src.actor.mock.patch_actor
        if _mock._registry and cls is not _MockSetup:
            self._share_mocks()
        actor_kind(cls)  # ValueError for a class that mixes sync and async endpoints
        _check_endpoint_names(cls)
        if self._stopped:
            raise SupervisionError(f"`ProcMesh` has already been stopped (proc mesh {self._name!r}); "
                                   "spawn on a new one")
        if self._init_error is not None:
            return self._unborn(name, cls)
        rt = self._rt()
        actor_id = f"{name}-{uuid.uuid4().hex[:12]}"
        with rt_pickling_for(rt):  # a client's port in the arguments reaches this job's actors
            payload = m.Pickled.of((cls, args, kwargs))
        shape = self._shape
        extent = dict(zip(shape.labels, shape.sizes))
        initialized: Future = Future(lambda _: None)
        targets = {self._procs[idx].addr: i for i, idx in enumerate(shape.indices)}
        port = rt.open_port(_Gather(rt, initialized, shape, f"{name}.__init__()", targets), list(targets))
        ctx = _current_ctx()
        owner_actor = ctx.actor
        creator = owner_actor.qualname if owner_actor is not None else "<root>"
        mesh: ActorMesh[Any] = ActorMesh(actor_id, name, cls, self._procs, shape, self, initialized)
        # Monarch's name of each actor, for the texts of failures the client sees (a proc's death).
        mesh._names = {self._procs[idx].addr: _qualname(creator, f"{cls.__module__}.{cls.__qualname__}", name,
                                                        shape.point(i), extent)
                       for i, idx in enumerate(shape.indices)}
        actors_on = self.__dict__.setdefault("_actors_on", {})
        for addr, qualname in mesh._names.items():
            actors_on.setdefault(addr, []).append(qualname)
        _telemetry.actor_mesh(rt, self, actor_id, name, cls, shape)
        supervision.watch_actor(actor_id, lambda msg: _report(
            owner_actor, MeshFailure(name, msg.rank, msg.host, msg.reason)))
        if self._owner and self._owner_actor is owner_actor:
            # The procs' owner is told of their deaths by _watch, once per actor mesh of its own.
            own = self.__dict__.setdefault("_own_meshes", [])
            own[:] = [entry for entry in own if not entry[0]._stopped]  # a stopped mesh fails no more
            own.append((mesh, {self._procs[idx].addr: i for i, idx in enumerate(shape.indices)}))
        else:
            # Procs this caller did not make: it is told of their deaths too, as the owner of
            # the actors on them (the procs' owner hears of it on its own).
            self._watch_for(owner_actor, name, shape, mesh)
        for i, idx in enumerate(shape.indices):
            rt.send(self._procs[idx].addr, m.SpawnActor(actor_id, name, payload, shape.point(i), extent, port,
                                                        rt.addr, creator))
        _add_child(mesh)
        return mesh

    def _unborn(self, name: str, cls: type) -> "ActorMesh[Any]":
        """As in Monarch, spawning on a mesh that never came up returns a mesh at once; its
        ``initialized`` and every call to it raise the mesh's failure (nothing is sent)."""
        err = self._init_error
        assert err is not None
        initialized: Future = Future()
        initialized.set_exception(err)
        mesh: ActorMesh[Any] = ActorMesh(f"{name}-{uuid.uuid4().hex[:12]}", name, cls, self._procs, self._shape,
                                         self, initialized)
        mesh._init_error = err
        return mesh

    def _share_mocks(self) -> None:
        """Give this mesh's procs the patches active here (once per set of patches)."""
        version, state = _mock.registry_state()
        if getattr(self, "_mock_version", None) == version:
            return
        self.spawn("mock_setup", _MockSetup, state).initialized.get()
        self._mock_version = version

    def _watch_for(self, owner_actor: Any, name: str, shape: Shape, mesh: "ActorMesh") -> None:
        rt = self._rt()
        for i, idx in enumerate(shape.indices):
            p = self._procs[idx]
            if p.addr == rt.addr:
                continue  # the client's own proc

            def on_death(err: SupervisionError, rank: int = i, host: str = p.host, addr: str = p.addr) -> None:
                if not mesh._stopped:
                    reason = _proc_death_reason(err, [mesh._names[addr]] if addr in mesh._names else None)
                    _report(owner_actor, MeshFailure(name, rank, host, reason, err.exit_code))
            rt.watch(p.addr, on_death)

    #: Set on a slice: the name of the mesh it was cut from (a class default: older pickles lack it).
    _slice_of: str | None = None

    def stop(self, reason: str = "stopped by client") -> Future:
        """Stop every actor (running ``__cleanup__``) and then the procs.

        Only the mesh ``spawn_procs`` returned may be stopped: a slice of it is refused (its
        ``get()`` raises ``ValueError``), as in Monarch, and stops nothing; stopping it would
        stop every proc of the whole mesh, not only the slice's.
        """
        fut: Future = Future()
        if self._slice_of is not None:
            fut.set_exception(ValueError("ProcMesh is not owned; must be stopped by an owner "
                                         f"(this is a slice of proc mesh {self._slice_of!r}: stop that mesh)"))
            return fut
        if self._stopped:
            fut.set_result(None)
            return fut
        self._stopped = True
        if "monarch._tensor.mesh" in __import__("sys").modules:
            __import__("sys").modules["monarch._tensor.mesh"].forget(self)
        threading.Thread(target=self._stop, args=(fut, reason), daemon=True).start()
        return fut

    def _stop(self, fut: Future, reason: str) -> None:
        try:
            self._stop_procs(reason)
        except BaseException as e:  # noqa: BLE001 - every outcome settles the Future: a caller's get() must not wait forever
            log.warning("proc mesh %r: stop failed: %s", self._name, e)
            fut.set_exception(e)
            return
        if self._init_error is not None:
            # As in Monarch: the procs are stopped all the same, and the stop reports the mesh's failure.
            fut.set_exception(self._init_error)
            return
        fut.set_result(None)

    def _stop_procs(self, reason: str) -> None:
        rt = self._rt()
        manager = self.__dict__.get("_logging")
        if manager is not None:  # as in Monarch: what the procs wrote is printed before they stop
            manager.flush()
            manager.close()
        procs = [self._procs[i] for i in self._shape.indices]
        stop_timeout = _config.seconds("stop_actor_timeout")
        host_timeout = _config.seconds("proc_stop_max_idle")
        grace = _config.seconds("mesh_terminate_timeout")
        acks = [rt.request(p.addr, lambda port: m.StopProc(port)) for p in procs]
        # One deadline for all: every proc was asked at once above, so N silent procs hold the stop
        # for stop_actor_timeout, not N times it (waiting each in turn with its own timeout).
        deadline = time.monotonic() + stop_timeout
        for a in acks:
            try:
                a.get(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as e:
                # A proc that is already gone (or does not answer in time) is retired below all the same.
                log.debug("proc mesh %r: stop of a proc: %s", self._name, e)
        err = SupervisionError(f"actor mesh is stopped due to proc mesh shutdown (proc mesh {self._name!r}: {reason})")
        for p in procs:
            if p.addr == rt.addr:
                continue  # the client's own proc: its actors are stopped, it goes on
            rt.disown(p.addr)
            rt.retire(p.addr, err)
        hosts = {p.host_rank: p for p in procs}
        if self._host_mesh is not None:
            from monarch_agents.fanout import fan_out

            # Every host at once, through the tree of host agents (one deadline, not one per host in turn).
            targets = [h for h in self._host_mesh._hosts if h.host_rank in hosts or len(self._host_mesh._hosts) == 1]
            call = fan_out(rt, [(h.addr, h.host, m.StopProcs(self._mesh_id, m.PortRef("", 0), grace)) for h in targets],
                           timeout_s=host_timeout)
            call.wait(host_timeout + 1.0)
            for i, h in enumerate(targets):
                ok, why = call.results.get(i, (False, "no answer"))
                if not ok:
                    # The host agent is gone or busy: its procs were already asked to stop one by one.
                    log.debug("proc mesh %r: StopProcs on %s: %s", self._name, h.addr, why)

    async def __aenter__(self) -> "ProcMesh":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self._stopped:
            await self.stop()

    # -- the tensor engine (monarch/_tensor/): torch ops inside the block run on these procs --

    @property
    def _device_mesh(self) -> Any:
        from monarch._tensor.mesh import device_mesh_of

        return device_mesh_of(self)

    def activate(self) -> Any:
        """Inside the block, torch ops (factories too) run on every proc and return remote tensors."""
        return self._device_mesh.activate()

    def rank_tensor(self, dim: str | list[str]) -> Any:
        """A remote 0-d tensor: each proc's coordinate along ``dim``."""
        return self._device_mesh.rank(dim)

    def rank_tensors(self) -> dict[str, Any]:
        return self._device_mesh.ranks

    async def logging_option(self, stream_to_client: bool = False, aggregate_window_sec: int | None = None,
                             level: int = logging.INFO) -> None:
        """Stream the procs' stdout/stderr to this client (``configure(enable_log_forwarding=True)``
        first), aggregated in windows of ``aggregate_window_sec`` s or line by line, and set the
        level of every proc's root logger (see ``monarch.actor._logging``)."""
        import asyncio  # here: a program that never awaits does not pay for asyncio

        await asyncio.get_running_loop().run_in_executor(
            None, self._logging_manager.set_mode, stream_to_client, aggregate_window_sec, level)

    @property
    def _logging_manager(self) -> Any:
        """This mesh's logging options and log client (made on first use; a slice has its own)."""
        manager = self.__dict__.get("_logging")
        if manager is None:
            from monarch.actor._logging import LoggingManager

            with _logging_lock:
                manager = self.__dict__.setdefault("_logging", LoggingManager(self))
        return manager

    def __enter__(self) -> "ProcMesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._stopped:
            self.stop().get()

    def __repr__(self) -> str:
        return f"ProcMesh({self.extent})"


class ActorMesh(_MeshBase, Generic[T]):
    """Actors of one class, one per proc of a mesh. ``mesh.method`` is an :class:`Endpoint`."""

    #: Monarch's name of the actor at each proc address (set by ``spawn``; not pickled).
    _names: dict = {}

    def __init__(self, actor_id: str, name: str, cls: type, procs: list[m.ProcInfo], shape: Shape,
                 proc_mesh: ProcMesh | None = None, initialized: Future | None = None):
        self._actor_id = actor_id
        self._name = name
        self._class = cls
        self._procs = procs
        self._shape = shape
        self._proc_mesh = proc_mesh
        self._initialized = initialized
        self._stopped = False

    #: Why its procs never came up (spawned on a failed proc mesh): each call raises it (a class default).
    _init_error: BaseException | None = None

    def _first_addr(self) -> str:
        return self._procs[0].addr if self._procs else ""

    def __reduce__(self) -> Any:
        # With its proc mesh (and so its host mesh), as Monarch's: a mesh received from an actor
        # still says where it runs (``mesh._proc_mesh._host_mesh.region``).
        return ActorMesh, (self._actor_id, self._name, self._class, self._procs, self._shape, self._proc_mesh)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        prop = endpoint_spec(self._class, name)
        if prop is None:
            if callable(getattr(self._class, name, None)):
                # As in Monarch: a placeholder that explains when called, and that
                # ``as_endpoint`` turns into an endpoint.
                return NotAnEndpoint(self, name)
            raise AttributeError(f"{self._class.__name__} has no endpoint {name!r}")
        ep: Endpoint[Any] = Endpoint(self, name, prop)
        self.__dict__[name] = ep  # the next ``mesh.name`` is a plain attribute
        return ep

    def slice(self, **dims: Any) -> "ActorMesh[T]":
        sub: ActorMesh[T] = ActorMesh(self._actor_id, self._name, self._class, self._procs,
                                      self._shape.slice(**dims), self._proc_mesh, self._initialized)
        sub._names = self._names
        sub._init_error = self._init_error
        return sub

    def flatten(self, name: str) -> "ActorMesh[T]":
        """The same actors along one dimension called ``name`` (row-major)."""
        flat: ActorMesh[T] = ActorMesh(self._actor_id, self._name, self._class, self._procs,
                                       self._shape.flatten(name), self._proc_mesh, self._initialized)
        flat._names = self._names
        flat._init_error = self._init_error
        return flat

    @property
    def initialized(self) -> Future:
        """Resolves once every ``__init__`` ran; raises SupervisionError if one failed."""
        return self._initialized if self._initialized is not None else Future.completed(None)

    def stop(self, reason: str = "stopped by client") -> Future:
        """Stop these actors (each runs ``__cleanup__``, then stops the meshes it made);
        later calls raise SupervisionError."""
        self._stopped = True
        if self._init_error is not None:
            return Future.completed(None)  # never started: nothing to stop
        rt = self._rt()
        shape = self._shape
        fut: Future = Future(lambda _: None)
        targets = {self._procs[idx].addr: i for i, idx in enumerate(shape.indices)}
        supervision.unwatch_actor(self._actor_id)
        gather = _Gather(rt, fut, shape, f"{self._name}.stop()", targets)
        port = rt.open_port(gather, list(targets))
        for i, idx in enumerate(shape.indices):
            try:
                rt.send(self._procs[idx].addr, m.StopActor(self._actor_id, port, i, reason))
            except SupervisionError:
                # Its proc is already gone, so it is as stopped as it will ever be.
                rt.mailbox.call_soon(functools.partial(gather.deliver, m.Reply(port.port_id, i, True, None)))
        return fut

    def __repr__(self) -> str:
        return f"ActorMesh({self._name!r}, {self._class.__name__}, {self.extent})"


# --- where am I -------------------------------------------------------------


def this_host() -> HostMesh:
    """The host this code runs on, as in PyTorch Monarch.

    In a script (``python prog.py`` or ``monarch run prog.py``) that is this machine, through the
    user's shared host agent (or a private one: see ``monarch.actor._client``); inside an actor, the host the actor runs on.
    A job's hosts come from the job, as in Monarch: ``monarch.job.job_load().state().hosts``
    (``monarch run prog.py`` points ``job_load()`` at the reservation it runs on).
    """
    agent = os.environ.get("MONARCH_HOST_AGENT")
    if agent:
        own = HostRef(agent, os.environ.get("MONARCH_HOSTNAME", ""), int(os.environ.get("MONARCH_HOST_RANK", "0")))
        return _hostmesh_extras.this_host_in_proc(own) or HostMesh([own])
    return HostMesh([local_host()])


def this_proc() -> ProcMesh:
    """The proc this code runs in, as a one-proc mesh: actors spawned on it run in this process
    (in the client too, as in Monarch)."""
    rt = ensure_runtime()
    info = m.ProcInfo(rt.addr, os.getpid(), rt.host, int(os.environ.get("MONARCH_HOST_RANK", "0")))
    if _current_ctx().actor is None and current_agent() is None:
        host_actors_in_client(rt)
    host = this_host() if "MONARCH_HOST_AGENT" in os.environ else None
    return ProcMesh([info], Shape((), (), (0,)), f"self-{os.getpid()}", "this_proc", host, False)


class ActorInstance:
    """``context().actor_instance``: who is running."""

    def __init__(self, info: Any):
        self._info = info

    @property
    def rank(self) -> Point:
        if self._info is None:
            return Point(0, Extent([], []))
        return Point(self._info.rank, Extent(list(self._info.extent), list(self._info.extent.values())))

    @property
    def name(self) -> str:
        return self._info.name if self._info else "root"

    @property
    def actor_id(self) -> "ActorId":
        return ActorId.of(self._info)

    @property
    def proc_id(self) -> str:
        """The proc this actor runs on, as its ``actor_id`` names it (``proc@addr``), as Monarch's docs
        use it (``context().actor_instance.proc_id``)."""
        return self.actor_id.proc_id

    @property
    def class_name(self) -> str:
        return self._info.class_name if self._info else ""

    @property
    def creator(self) -> "CreatorInstance | None":
        """Who spawned this actor, as Monarch gives it: ``.name`` is ``"root"`` (the client) or the
        creating actor's mesh name, ``str()`` its full name (``<root>.<mod.Cls parent>``)."""
        if not self._info:
            return None
        slot = getattr(self._info, "slot", None)
        return CreatorInstance(getattr(getattr(slot, "msg", None), "creator", None) or "<root>")

    @property
    def proc(self) -> ProcMesh:
        return this_proc()

    proc_mesh = proc

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor once the messages already queued for it are handled (``__cleanup__`` runs,
        the meshes it made stop); later calls raise SupervisionError.  Not a failure."""
        if self._info is None or self._info.slot is None:
            raise RuntimeError("stop() is for actors; the client stops with shutdown_context()")
        self._info.slot.stop_self(reason)

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor: its owner gets a supervision event, later calls raise SupervisionError."""
        if self._info is None or self._info.slot is None:
            raise RuntimeError("abort() is for actors; the client has no owner to report to")
        self._info.slot.abort(reason)

    def _as_rust(self) -> "ActorInstance":
        """What Monarch's runtime calls take as the sender (``PortRef.send``): this instance."""
        return self

    def _undeliverable(self, envelope: Any) -> None:
        """A message this actor sent came back: it sees it after the message it is handling."""
        if self._info is None or self._info.slot is None:
            raise RuntimeError(str(envelope))  # the client sent it: it hears at once
        self._info.slot.post_undelivered(envelope)

    def __repr__(self) -> str:
        return (self._info.qualname or f"<{self.name} {self.rank}>") if self._info else "<root>"


class ActorId(str):
    """``context().actor_instance.actor_id``: the actor's id, a string unique to the actor as Monarch's
    is (``NAME-HEX[RANK]``, what ``current_actor_name()`` says; the client's ``root``), that also
    answers what Monarch's ``ActorAddr`` does: ``actor_name``/``label`` (the name it was spawned with;
    the client's is ``client``), ``uid``/``pid`` (``name<v>``, the mesh id's value in ``Uid``'s base
    58), ``proc_name``/``proc_label`` (its process: host and pid; the client's ``local``), ``addr``
    (its process's address), ``proc_id`` (``proc@addr``) and ``is_root`` (only the client's)."""

    actor_name: str
    uid: str
    proc_name: str
    addr: str
    is_root: bool

    @staticmethod
    def of(info: Any) -> "ActorId":
        if info is None:
            from monarch_agents import runtime as _rt

            rt = _rt.current()
            aid = ActorId("root")
            aid.actor_name = aid.uid = "client"
            aid.proc_name, aid.addr, aid.is_root = "local", rt.addr if rt is not None else "", True
            return aid
        aid = ActorId(f"{info.actor_id}[{info.rank}]")
        aid.actor_name = info.name
        _, _, suffix = info.actor_id.rpartition("-")
        try:
            aid.uid = f"{info.name}<{_ids._encode(int(suffix, 16))}>"
        except ValueError:  # not NAME-HEX (a client-hosted actor's id is its own)
            aid.uid = info.actor_id
        aid.proc_name, aid.addr, aid.is_root = _names.proc_name(info.host, os.getpid()), info.proc_addr, False
        return aid

    @property
    def label(self) -> str:
        return self.actor_name

    @property
    def pid(self) -> str:
        return self.uid

    @property
    def proc_label(self) -> str:
        return self.proc_name

    @property
    def proc_id(self) -> str:
        return f"{self.proc_name}@{self.addr}"


class CreatorInstance:
    """The actor (or client) that spawned an actor: ``name`` and, as ``str()``, its full name."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    @property
    def name(self) -> str:
        last = self._qualname.rsplit(".<", 1)[-1].strip("<>")
        if last == "root":
            return "root"
        return last.rsplit(" ", 1)[-1].split("{", 1)[0]  # "mod.Cls name{'gpus': 0/2}" -> name

    def __str__(self) -> str:
        return self._qualname

    __repr__ = __str__


class Context:
    """What ``context()`` returns: the running actor and the rank of the current message."""

    def __init__(self) -> None:
        self._ctx = _current_ctx()

    @property
    def actor_instance(self) -> ActorInstance:
        return ActorInstance(self._ctx.actor)

    @property
    def message_rank(self) -> Point:
        c = self._ctx
        return Point(c.rank, Extent(list(c.extent), list(c.extent.values())))


class _Lazy(Generic[T]):
    """A value made on first ``get()`` (once, whichever thread asks first)."""

    def __init__(self, init: Callable[[], T]) -> None:
        self._lock = threading.Lock()
        self._val: T | None = None
        self._init = init

    def get(self) -> T:
        with self._lock:
            if self._val is None:
                self._val = self._init()
            return self._val

    def try_get(self) -> T | None:
        return self._val


def _root_context() -> Context:
    return Context()


#: The client's own context, what ``context()`` answers outside any actor (Monarch's name: its
#: tests count the calls, to see that a thread asking does not make a new client each time).
_client_context: _Lazy[Context] = _Lazy(_root_context)


def context() -> Context:
    """The current actor and message (the same object for the whole of one message's handling);
    outside any actor, the client's."""
    ctx = _current_ctx()
    if ctx is _ROOT_CTX:
        return _client_context.get()
    view = ctx.view
    if view is None:
        view = ctx.view = Context()
    return view


def current_rank() -> Point:
    """This actor's rank within the slice that was messaged."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """The sizes of the slice that was messaged."""
    return dict(_current_ctx().extent)


def current_actor_name() -> str:
    """The running actor's id, unique to this actor (its mesh's id and its rank)."""
    info = _current_ctx().actor
    if info is None:
        return "root"
    return f"{info.actor_id}[{info.rank}]"


# --- controllers --------------------------------------------------------------

_CONTROLLERS_ID = "monarch-controllers"


class _Controllers(Actor):
    """Lives in the root client: one actor mesh per controller name."""

    def __init__(self) -> None:
        self.meshes: dict[str, ActorMesh] = {}

    @endpoint
    def get_or_spawn(self, name: str, cls: type, args: tuple, kwargs: dict) -> "ActorMesh":
        mesh = self.meshes.get(name)
        if mesh is None:
            mesh = self.meshes[name] = this_proc().spawn(name, cls, *args, **kwargs)
        return mesh

    @endpoint
    def find(self, name: str) -> "ActorMesh | None":
        """The controller called ``name`` if one was spawned, else None (nothing is spawned)."""
        return self.meshes.get(name)


def _controllers_mesh() -> ActorMesh:
    rt = ensure_runtime()
    root = os.environ.get(ROOT_ENV)
    if not root or root == rt.addr:
        root = rt.addr
        agent = current_agent() or host_actors_in_client(rt)
        agent.lazy_actor(_CONTROLLERS_ID, lambda reply: m.SpawnActor(
            _CONTROLLERS_ID, "controller_controller", m.Pickled.of((_Controllers, (), {})), {}, {}, reply, rt.addr))
    return ActorMesh(_CONTROLLERS_ID, "controller_controller", _Controllers,
                     [m.ProcInfo(root, 0, "", 0)], Shape((), (), (0,)))


def get_or_spawn_controller(name: str, cls: type[T], *args: Any, **kwargs: Any) -> Future["ActorMesh[T]"]:
    """The one actor called ``name`` in this job, spawned (in the root client's process) on first use.

    Any actor or the client may call it; each gets the same actor mesh back.
    """
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise ValueError(f"{cls!r} is not an Actor subclass")
    return _controllers_mesh().get_or_spawn.call_one(name, cls, args, kwargs)


# The job API's additions to HostMesh/ProcMesh (its module imports this one's classes).
from monarch.actor import _hostmesh_extras  # noqa: E402


def _offer_breakpoint(frame: Any, header: str | None) -> bool:
    """``breakpoint()`` in an actor goes to the program's own debugger actor where it made one (Monarch's
    ``DebugController``; the module is imported only then: it imports pdb)."""
    from monarch._src.actor.debugger.breakpoint import actor_breakpoint

    return actor_breakpoint(frame, header)


_debug_rank.actor_debugger = _offer_breakpoint


def _remote_loader(filename: str) -> Any:
    """What functions pickled by value carry as ``__loader__`` (``monarch_agents.wire.source_loader``)."""
    from monarch._src.actor.source_loader import RemoteImportLoader

    return RemoteImportLoader(filename)


_wire.source_loader = _remote_loader
