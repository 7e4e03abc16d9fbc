"""What ``HostMesh`` and ``ProcMesh`` add for Monarch's job API: pinning procs to CPUs
(``spawn_procs(proc_bind=)``), ``shutdown``/``stop`` of what a host mesh spawned,
and ``with_python_executable`` (``ProcMesh.logging_option`` is ``monarch.actor._logging``'s).

Kept apart from ``_mesh.py`` (the mesh mechanics) so each stays one job.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
from typing import Any

from monarch_agents.future import Future
from monarch.actor._endpoint import endpoint
from monarch.actor._mesh import Actor, HostMesh, ProcMesh, current_rank

log = logging.getLogger("monarch.actor")
_BIND_KEYS = ("cpus", "physcpubind", "cpunodebind", "membind")
_STOP_WAIT_S = 30.0


# -- shutdown / stop ----------------------------------------------------------------------------


def check_usable(hm: HostMesh) -> None:
    if getattr(hm, "_shut_down", False) or hm.__dict__.get("_inner_host_mesh", True) is None:
        raise RuntimeError("HostMesh has already been shut down")


#: Every proc mesh this process spawned on a host mesh, so a job that is killed stops its procs first.
_all_spawned: list[ProcMesh] = []
_lock = threading.Lock()


def remember(hm: HostMesh, pm: ProcMesh) -> None:
    hm.__dict__.setdefault("_spawned", []).append(pm)
    with _lock:
        _all_spawned[:] = [p for p in _all_spawned if not p._stopped]
        _all_spawned.append(pm)


def stop_procs_on(host_addrs: set[str], reason: str = "its job was killed") -> None:
    """Stop (and wait for) every proc mesh this process spawned on any of these host agents.

    Called before a job's hosts are released, so their procs end as stopped, not as failures.
    """
    with _lock:
        victims = [p for p in _all_spawned if not p._stopped and p._host_mesh is not None
                   and host_addrs & {h.addr for h in p._host_mesh._hosts}]
    for f in [p.stop(reason) for p in victims]:
        try:
            f.get(timeout=_STOP_WAIT_S)
        except Exception as e:
            # A proc that fails to stop is released with its hosts right after this.
            log.debug("stopping a proc mesh before its hosts are released: %s", e)


def stop_spawned(hm: HostMesh, final: bool) -> Future:
    if final:
        check_usable(hm)
        hm._shut_down = True
    spawned = hm.__dict__.get("_spawned", [])  # shared with its slices: stopping the mesh stops theirs too
    meshes, spawned[:] = list(spawned), []
    done: Future = Future()
    workers = final and hm.__dict__.get("_workers", False)

    def stop_all() -> None:
        stops = [pm.stop("its host mesh was shut down" if final else "its host mesh was stopped") for pm in meshes]
        for f in stops:
            try:
                f.get(timeout=_STOP_WAIT_S)
            except Exception as e:
                log.debug("stopping a proc mesh of a stopped host mesh: %s", e)  # a proc already gone is stopped
        if workers:  # hosts of attach_to_workers: their agents end, as Monarch's shutdown ends hosts
            from monarch.actor._bootstrap import release_workers

            release_workers([h.addr for h in hm.hosts])
        if final:
            hm._inner_host_mesh = None  # as in Monarch: a shut-down mesh lets go of its native mesh
        done.set_result(None)

    if meshes or workers:
        threading.Thread(target=stop_all, name="hostmesh-stop", daemon=True).start()
    else:
        if final:
            hm._inner_host_mesh = None
        done.set_result(None)
    return done


# -- proc_bind ----------------------------------------------------------------------------------


def check_proc_bind(proc_bind: Any, procs_per_host: int) -> None:
    if not isinstance(proc_bind, list) or not all(isinstance(b, dict) for b in proc_bind):
        raise ValueError(f"proc_bind must be a list of dicts (one per proc of a host), got {proc_bind!r}")
    if len(proc_bind) != procs_per_host:
        raise ValueError(f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({procs_per_host})")
    for b in proc_bind:
        unknown = sorted(set(b) - set(_BIND_KEYS))
        if unknown:
            raise ValueError(f"unknown proc_bind key(s) {unknown}; known: {', '.join(_BIND_KEYS)}")
        for key in ("cpus", "physcpubind", "cpunodebind"):
            if key in b:
                parse_cpu_list(str(b[key]))  # a typo fails here, before any proc is touched


def parse_cpu_list(text: str) -> set[int]:
    """``"0-3,8,10-11"`` as a set of numbers (Linux's cpulist format)."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}: use numbers and ranges, e.g. '0-3,8'") from None
        if a < 0 or b < a:
            raise ValueError(f"bad CPU list {text!r}: use numbers and ranges, e.g. '0-3,8'")
        out.update(range(a, b + 1))
    if not out:
        raise ValueError(f"empty CPU list {text!r}")
    return out


def _node_cpus(nodes: set[int]) -> set[int]:
    cpus: set[int] = set()
    for n in sorted(nodes):
        try:
            with open(f"/sys/devices/system/node/node{n}/cpulist") as f:
                cpus |= parse_cpu_list(f.read().strip())
        except OSError:
            raise ValueError(f"NUMA node {n} does not exist on this host") from None
    return cpus


class _ProcBind(Actor):
    """Pins its proc (every thread of it) to the CPUs its entry of ``proc_bind`` names."""

    def __init__(self, proc_bind: list[dict[str, str]], procs_per_host: int):
        self.proc_bind = proc_bind
        self.procs_per_host = procs_per_host

    @endpoint
    def apply(self) -> list[int]:
        entry = self.proc_bind[current_rank().rank % self.procs_per_host]
        cpus: set[int] | None = None
        for key in ("cpus", "physcpubind"):
            if key in entry:
                cpus = parse_cpu_list(str(entry[key]))
        if "cpunodebind" in entry:
            node_cpus = _node_cpus(parse_cpu_list(str(entry["cpunodebind"])))
            cpus = node_cpus if cpus is None else cpus & node_cpus
        if cpus is None:
            return sorted(os.sched_getaffinity(0))
        # sched_setaffinity(0) pins only the calling thread: pin every thread there is now;
        # threads started later inherit it from their creator.
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except ProcessLookupError:
                pass
        return sorted(os.sched_getaffinity(0))


def bind_procs(pm: ProcMesh, proc_bind: list[dict[str, str]], procs_per_host: int) -> None:
    binder = pm.spawn("_proc_bind", _ProcBind, proc_bind, procs_per_host)
    try:
        binder.apply.call().get()
    finally:
        binder.stop().get()


# -- python executable, logging -------------------------------------------------------------------


def with_python_executable(hm: HostMesh, python_executable: str) -> HostMesh:
    """The same hosts, for procs that run ``python_executable`` (``-m monarch_agents.proc_exec``)
    instead of forking the host agent's warm interpreter; ``this_host()`` inside them is such a
    mesh too, so the procs they spawn run it as well."""
    check_usable(hm)
    out = HostMesh(hm._hosts, hm._shape, python_exe=_python_of(python_executable))
    if hm.__dict__.get("_reference"):
        out._reference = True
    return out


def _python_of(program: str) -> str | None:
    """None for the interpreter procs fork from (this one's), else the program to exec."""
    found = shutil.which(program) or program
    return None if os.path.realpath(found) == os.path.realpath(sys.executable) else program


#: The entry points a bootstrap command may name: monarch's, and Monarch's (which means the same).
_ENTRY_ARGS = (["-m", "monarch_agents.zygote"], ["-m", "monarch._src.actor.bootstrap_main"])


def bootstrap_plans(command: Any, hy: Any, per_host: dict[str, int], count: int) -> list[dict] | None:
    """For ``spawn_procs(bootstrap_command=...)``: each proc's ``{"env", "python"}`` (the
    ``SpawnProcs.per_proc`` entries, host by host), or None when every proc starts the usual way.

    A command sets a proc's environment (``with_env``; ``None`` unsets) and its interpreter (its
    program); its arguments must name the proc entry point, since procs run monarch's.
    """
    from monarch.actor._bootstrap import BootstrapCommand
    from monarch.actor._shape import Extent, Point

    if command is None:
        if hy.python_exe is None:
            return None
        return [{"env": {}, "python": hy.python_exe}] * (len(hy.hosts) * count)
    if not (isinstance(command, BootstrapCommand) or callable(command)):
        raise TypeError(f"bootstrap_command must be a BootstrapCommand or a function of a Point, got {command!r}")
    labels = [*hy._shape.labels, *per_host]
    sizes = [*hy._shape.sizes, *per_host.values()]
    plans = []
    for rank in range(len(hy.hosts) * count):
        cmd = command if isinstance(command, BootstrapCommand) else command(Point(rank, Extent(labels, sizes)))
        if not isinstance(cmd, BootstrapCommand):
            raise TypeError(f"bootstrap_command returned {cmd!r}, not a BootstrapCommand")
        if list(cmd.args) not in _ENTRY_ARGS:
            raise NotImplementedError(
                f"bootstrap_command {cmd}: procs run monarch's entry point; a command may set their interpreter "
                f"(program) and environment (with_env), and its args must be {_ENTRY_ARGS[0]}")
        if not cmd.inherit_env:
            raise NotImplementedError("bootstrap_command with inherit_env=False: a proc starts from its host "
                                      "agent's environment; unset variables with with_env({name: None})")
        python = _python_of(cmd.program) if cmd.program else None
        plans.append({"env": dict(cmd.env), "python": python or hy.python_exe})
    return plans


#: In a proc: the hosts its mesh was cut from (JSON: each host's address, name and rank; the
#: interpreter its procs run) and which of them is its own, for ``this_host()`` there.
HOST_MESH_ENV = "MONARCH_HOST_MESH"
HOST_INDEX_ENV = "MONARCH_HOST_INDEX"


def host_mesh_env(hy: Any) -> str:
    return json.dumps({"hosts": [[h.addr, h.host, h.host_rank] for h in hy._all], "python": hy.python_exe})


def this_host_in_proc(own: Any) -> HostMesh | None:
    """``this_host()`` in a proc, as Monarch's: its own host, cut from the hosts its mesh was
    spawned on (so ``region`` and ``_new_with_shape`` place it among them), carrying their
    interpreter.  Its own entry is the address it was started by (the client's may be a forward)."""
    from monarch.actor._client import HostRef
    from monarch.actor._shape import Shape

    try:
        desc = json.loads(os.environ[HOST_MESH_ENV])
        index = int(os.environ[HOST_INDEX_ENV])
        hosts = [HostRef(str(a), str(n), int(r)) for a, n, r in desc["hosts"]]
        hosts[index] = own
    except (KeyError, ValueError, TypeError, IndexError):
        return None
    python = desc.get("python")
    return HostMesh(hosts, Shape((), (), (index,)), python_exe=python if isinstance(python, str) else None)


class _LogLevel(Actor):
    @endpoint
    def set(self, level: int) -> None:
        logging.getLogger().setLevel(level)


async def logging_option(pm: ProcMesh, stream_to_client: bool, aggregate_window_sec: int | None, level: int) -> None:
    """Set the level of the root logger in every proc of ``pm``.

    Where proc output goes is the host agent's: the client's terminal for ``this_host()``, the
    job's logs (``monarch logs``) for a reservation.  ``stream_to_client`` and
    ``aggregate_window_sec`` are checked as Monarch checks them and otherwise not used.
    """
    if aggregate_window_sec is not None and not stream_to_client:
        raise ValueError("aggregate_window_sec is set but stream_to_client is False: aggregation needs streaming")
    if not isinstance(level, int) or isinstance(level, bool):
        raise ValueError(f"level must be a logging level such as logging.INFO, got {level!r}")
    setter = pm.spawn("_log_level", _LogLevel)
    try:
        await setter.set.call(level)
    finally:
        await setter.stop()
