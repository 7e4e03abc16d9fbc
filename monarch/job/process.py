"""``ProcessJob``: hosts that are processes on this machine (monarch's local scheduler).

    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    state = job.state()            # three host agents on this machine, reserved as `monarch serve` does
    state.trainers                 # HostMesh of 2 hosts

Each host is a long-lived monarch host agent, so the reservation is the one ``monarch serve
--hosts 3`` makes: ``monarch status`` shows it, ``monarch run`` uses it, ``monarch stop`` (or
``job.kill()``) releases it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from typing import Any

from monarch.job.job import Job


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a child of ours that exited is reaped here)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def check_meshes(meshes: Any, kind: str) -> dict[str, int]:
    """``meshes`` as a dict of mesh name -> host count, or a ValueError that says what is wrong."""
    if not isinstance(meshes, dict) or not meshes:
        raise ValueError(f"{kind} takes a dict of mesh name -> number of hosts, e.g. {{'hosts': 2}}; got {meshes!r}")
    out = {}
    for name, n in meshes.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"mesh name {name!r} must be a Python identifier (it becomes state.<name>)")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"mesh {name!r} needs a positive number of hosts, got {n!r}")
        out[name] = n
    return out


class ProcessJob(Job):
    """Each host of each mesh is a process on this machine (a monarch host agent).

    Args:
        meshes: mesh name -> number of hosts, e.g. ``{"hosts": 2}``.
        env: extra environment variables for the host agents and the procs they start.
    """

    def __init__(self, meshes: dict[str, int], env: dict[str, str] | None = None) -> None:
        super().__init__()
        self._meshes = check_meshes(meshes, "ProcessJob")
        if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                    for k, v in env.items())):
            raise ValueError(f"env must map names to strings, got {env!r}")
        self._env = dict(env) if env else None

    @classmethod
    def _attached(cls, meshes: dict[str, int], record: Any, path: str | None) -> "ProcessJob":
        job = cls(meshes, env=(record.spec.options or {}).get("env"))
        Job.__init__(job, record, path)
        return job

    def _job_spec(self):
        from monarch._workbench.state import JobSpec

        options: dict = {"env": dict(self._env)} if self._env else {}
        return JobSpec("local", sum(self._meshes.values()), 1, options)

    def _mesh_sizes(self) -> dict[str, int]:
        return dict(self._meshes)

    @property
    def _host_to_pid(self) -> dict[str, Any]:
        """Each host of the running job -> ``ProcessState(pid, channel)`` of its host agent (a process
        of this machine), keyed ``<mesh>_<index>``; empty when not running.  Monarch's ProcessJob has
        this table of its worker processes, and its tests read the pids from it.

        A subclass whose ``_create`` starts worker loops itself, as Monarch's ProcessJob subclasses
        do, fills it (``self._host_to_pid[key] = ProcessState(pid, "ipc://...")``): the job's hosts
        are then those workers, attached to (see :meth:`_state`)."""
        from monarch.job.job import ProcessState

        record = self.record
        if record is None:
            return self.__dict__.setdefault("_workers", {})
        if record.spec.scheduler != "local":
            return {}
        hosts = sorted(record.hosts, key=lambda h: h.host_rank)
        out, i = {}, 0
        for mesh, n in self._meshes.items():
            for k in range(n):
                if i < len(hosts):
                    out[f"{mesh}_{k}"] = ProcessState(hosts[i].pid, hosts[i].addr)
                i += 1
        return out

    def _own_workers(self) -> dict[str, Any]:
        """The worker loops a subclass's ``_create`` started (empty for a reservation)."""
        return self.__dict__.get("_workers") or {} if self.record is None else {}

    def _state(self) -> Any:
        workers = self._own_workers()
        if not workers:
            return super()._state()
        from monarch.actor import attach_to_workers
        from monarch.job.job import JobState

        if not self._workers_alive():
            raise RuntimeError("lost connection to worker processes")  # Monarch's
        meshes = {name: attach_to_workers(name=name, ca="trust_all_connections",
                                          workers=[workers[f"{name}_{i}"].channel for i in range(n)])
                  for name, n in self._meshes.items()}
        self.__dict__.setdefault("_attached", []).extend(meshes.values())
        return JobState(meshes)

    def _workers_alive(self) -> bool:
        for p in self._own_workers().values():
            try:
                os.kill(p.pid, 0)
            except OSError:
                return False
        return bool(self._own_workers())

    def can_run(self, spec: Any) -> bool:
        if self._own_workers():
            return isinstance(spec, ProcessJob) and spec._meshes == self._meshes and self._workers_alive()
        return super().can_run(spec)

    def _kill(self) -> None:
        workers = self._own_workers()
        if not workers:
            return super()._kill()
        from monarch.actor._bootstrap import release_workers
        from monarch.actor._hostmesh_extras import stop_procs_on

        # Procs this process started there end as stopped, not as failures of their owner; then each
        # worker stops its host agent when told the mesh is done, and returns from its loop; one that
        # does not within a few seconds is killed.
        attached = self.__dict__.pop("_attached", [])
        addrs = {h.addr for mesh in attached for h in mesh.hosts}
        with contextlib.suppress(Exception):
            stop_procs_on(addrs)
        with contextlib.suppress(Exception):
            release_workers(sorted(addrs))
        deadline = time.monotonic() + 5.0
        for p in workers.values():
            while time.monotonic() < deadline and _alive(p.pid):
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)  # the worker's session (start_new_session), if it leads one
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGKILL)
        workers.clear()
        tmpdir = self.__dict__.pop("_tmpdir", None)  # Monarch's subclasses keep their sockets' folder there
        if isinstance(tmpdir, str):
            shutil.rmtree(tmpdir, ignore_errors=True)

    def _same_spec(self, spec: Any) -> bool:
        # Monarch: a ProcessJob with the same meshes (the environment is part of what we reserved).
        return isinstance(spec, ProcessJob) and spec._meshes == self._meshes and spec._env == self._env \
            and self.record is not None and self.record.spec.scheduler == "local"


__all__ = ["ProcessJob"]
