"""What ``HostMesh`` and ``ProcMesh`` add for Monarch's job API: pinning procs to CPUs
(``spawn_procs(proc_bind=)``), ``shutdown``/``stop`` of what a host mesh spawned,
and ``with_python_executable`` (``ProcMesh.logging_option`` is ``monarch.actor._logging``'s).

Kept apart from ``_mesh.py`` (the mesh mechanics) so each stays one job.
"""

from __future__ import annotations

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
    """The same hosts, for procs that run ``python_executable``.

    monarch starts procs by forking a warm copy of the host agent's interpreter, so the only
    interpreter it can give them is that one: naming it works (a no-op), another one raises
    ``NotImplementedError`` saying so.
    """
    check_usable(hm)
    found = shutil.which(python_executable) or python_executable
    if os.path.realpath(found) != os.path.realpath(sys.executable):
        raise NotImplementedError(
            f"procs run the host agents' interpreter ({sys.executable}); monarch cannot start them under "
            f"{python_executable}. Reserve with that interpreter instead (`{python_executable} -m monarch_cli.main "
            "serve`, or SlurmJob(python_exe=...))")
    return HostMesh(hm._hosts, hm._shape)
