"""monarch.job: PyTorch Monarch's job API, on monarch reservations.

    from monarch.job import ProcessJob, SlurmJob, job_load

    job = ProcessJob({"hosts": 2})         # or SlurmJob(meshes={"hosts": 2}, partition="debug")
    hosts = job.state().hosts              # reuses the cached job (.monarch/job_state.pkl) when it can
    procs = hosts.spawn_procs(per_host={"gpus": 2})

    job_load().state().hosts               # later, from another process (or a `monarch serve` reservation)

A job made here is the reservation ``monarch serve`` makes: ``monarch status``, ``monarch run``
and ``monarch stop`` see it.  Names load lazily, so importing this package costs nothing until a
name is used.  This package is Monarch's job API only; the workbench's engine under it is the
private ``monarch._workbench``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# What type checkers see (re-exported through __all__); at run time the names load lazily (__getattr__ below).
if TYPE_CHECKING:
    from monarch.job.job import (DEFAULT_JOB_PATH, Job, JobState, JobTrait, LocalJob, job_load,  # noqa: F401
                                 job_loads, load_current_job, set_current_job, MeshAdminConfig, TelemetryConfig)
    from monarch.actor._bootstrap import hosts_from_config  # noqa: F401
    from monarch.job._service_identity import (SERVICE_PROC_IDS_ENV, SERVICE_PROC_RANK_ENV,  # noqa: F401
                                               deserialize_service_proc_ids, new_service_proc_id,
                                               ranked_service_proc_id_from_env, serialize_service_proc_ids,
                                               service_proc_addr, service_proc_addrs)
    from monarch.job.process import ProcessJob  # noqa: F401
    from monarch.job.slurm import SlurmJob  # noqa: F401
    from monarch_schedulers.base import JobSpec  # noqa: F401
    from monarch._workbench.exec import exec_command  # noqa: F401
    from monarch._workbench.port_forward import PortForwarder  # noqa: F401

_EXPORTS = {
    "DEFAULT_JOB_PATH": "monarch.job.job",
    "Job": "monarch.job.job",
    "JobState": "monarch.job.job",
    "JobTrait": "monarch.job.job",
    "MeshAdminConfig": "monarch.job.job",
    "TelemetryConfig": "monarch.job.job",
    "hosts_from_config": "monarch.actor._bootstrap",
    "new_service_proc_id": "monarch.job._service_identity",
    "serialize_service_proc_ids": "monarch.job._service_identity",
    "deserialize_service_proc_ids": "monarch.job._service_identity",
    "service_proc_addr": "monarch.job._service_identity",
    "service_proc_addrs": "monarch.job._service_identity",
    "ranked_service_proc_id_from_env": "monarch.job._service_identity",
    "SERVICE_PROC_IDS_ENV": "monarch.job._service_identity",
    "SERVICE_PROC_RANK_ENV": "monarch.job._service_identity",
    "LocalJob": "monarch.job.job",
    "job_load": "monarch.job.job",
    "job_loads": "monarch.job.job",
    "load_current_job": "monarch.job.job",
    "set_current_job": "monarch.job.job",
    "ProcessJob": "monarch.job.process",
    "SlurmJob": "monarch.job.slurm",
    "JobSpec": "monarch_schedulers.base",
    "exec_command": "monarch._workbench.exec",
    "PortForwarder": "monarch._workbench.port_forward",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch.job' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def shell(host_mesh_singleton: Any, *, env: dict[str, str] | None = None, workdir: str | None = None) -> int:
    """An interactive shell on a one-host mesh; returns its exit status (see ``monarch._workbench.host_shell``)."""
    from monarch._workbench.host_shell import shell as run_shell

    return run_shell(host_mesh_singleton, env=env, workdir=workdir)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = sorted([*_EXPORTS, "shell"])
