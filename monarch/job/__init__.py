"""monarch.job: load the reservation ``monarch serve`` made, in Python.

    from monarch.job import job_load
    job = job_load()                      # .monarch/job_state.pkl
    hosts = job.state().hosts             # HostMesh of the reserved hosts
    procs = hosts.spawn_procs(per_host={"gpus": 2})
"""

from __future__ import annotations

import os
from typing import Any

from monarch.job.state import JobRecord, JobSpec, StatePaths

DEFAULT_JOB_PATH = ".monarch/job_state.pkl"


class JobState:
    """The live meshes of a job: ``state.hosts`` is the HostMesh of its hosts."""

    def __init__(self, hosts: dict[str, Any]):
        self._hosts = hosts

    def __getattr__(self, name: str) -> Any:
        try:
            return self._hosts[name]
        except KeyError:
            raise AttributeError(f"job has no mesh {name!r}; it has {sorted(self._hosts)}") from None

    def __repr__(self) -> str:
        return f"JobState(hosts={self._hosts!r})"


class Job:
    """A reservation loaded from a state file."""

    def __init__(self, record: JobRecord, path: str):
        self.record = record
        self.path = path

    def state(self, cached_path: str | None = None) -> JobState:
        """The job's meshes; waits for agents if the reservation is still starting."""
        from monarch.job.reserve import load_live

        self.record, self.path = load_live(path=self.path)
        return JobState({"hosts": self.record.host_mesh()})

    def kill(self) -> None:
        """Release the reservation (like ``monarch stop``)."""
        from monarch.job.reserve import release

        release(self.record, self.path)

    @property
    def active(self) -> bool:
        from monarch.job.reserve import describe

        d = describe(self.record)
        return d is not None and d.state.alive


def job_load(filename: str | None = None) -> Job:
    """Load the job at ``filename`` (default: MONARCH_JOB, else .monarch/job_state.pkl).

    A job made by ``monarch.job.spmd.serve`` comes back as an ``SPMDJob`` (with ``run_spmd()``).
    """
    from monarch.job.state import load_state

    path = os.path.abspath(filename) if filename else StatePaths().resolve(None)
    record = load_state(path)
    if record.program is not None:
        from monarch.job.spmd import SPMDJob

        return SPMDJob(record, path)
    return Job(record, path)


__all__ = ["DEFAULT_JOB_PATH", "Job", "JobState", "JobSpec", "job_load"]
