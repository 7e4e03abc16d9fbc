"""The scheduler interface: how hosts are obtained and released.

A scheduler turns a :class:`JobSpec` into a request
(``dryrun``, pure), submits it (``allocate``: starts one host agent per host,
each of which writes its address to ``<job_dir>/agents/<rank>.json``), says how
the allocation is doing (``describe``), releases it (``release``, idempotent)
and shows its logs (``logs``).  Waiting for the agents is the caller's job
(``monarch/_workbench/reserve.py``), the same for every scheduler, which makes a
:class:`HostRecord` of each.  Both records live here, with the interface they type (the state
file of a reservation is made of them).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HostRecord:
    """One reserved host and its agent (from the address file its agent wrote)."""

    host: str
    host_rank: int
    addr: str
    pid: int
    ip: str
    log_dir: str


@dataclass
class JobSpec:
    """What was asked for; two specs are compatible when a reservation can be reused."""

    scheduler: str = "local"
    hosts: int = 1
    procs_per_host: int = 1
    options: dict = field(default_factory=dict)

    def compatible(self, other: "JobSpec") -> bool:
        return (self.scheduler, self.hosts, self.procs_per_host, self.options) == (
            other.scheduler, other.hosts, other.procs_per_host, other.options)

    def summary(self) -> str:
        return (f"{self.hosts} host{'s' if self.hosts != 1 else ''} × {self.procs_per_host} "
                f"proc{'s' if self.procs_per_host != 1 else ''} ({self.scheduler})")


class HostState(enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    ENDED = "ENDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"

    @property
    def alive(self) -> bool:
        """Not known to be over. UNKNOWN counts: a scheduler that cannot answer
        right now (a slow controller) is no proof the hosts are gone."""
        return self not in (HostState.ENDED, HostState.FAILED)


@dataclass(frozen=True)
class AllocateRequest:
    """Everything needed to submit; ``text`` is what ``serve --dryrun`` prints."""

    scheduler: str
    job_dir: str
    hosts: int
    text: str
    payload: Any = None


@dataclass
class Description:
    """How an allocation is doing, in one vocabulary for every scheduler."""

    job_id: str
    state: HostState
    reason: str = ""
    native_state: str = ""
    nodes: list[str] = field(default_factory=list)
    time_left_s: float | None = None
    #: Per-host detail where the scheduler has more to say (kubernetes: a pod's phase, restarts, node).
    details: list[dict] = field(default_factory=list)


class Scheduler(abc.ABC):
    """Obtain and release hosts. Backends implement these five methods."""

    name: str = ""
    #: Modules every host agent's zygote imports once (``--preload``), so procs start with them
    #: loaded; set by the layer above (the Python API its procs run), which this one may not name.
    agent_preload: tuple[str, ...] = ()
    #: Keys of running agents that ``allocate`` adopted instead of the job's new ones (kubernetes
    #: --attach); None: the agents use the keys they were given.  Handed over here, not re-read from
    #: the job folder's file.
    adopted_keys: Any = None
    #: The job's keys (``monarch_agents.keys.JobKeys``), handed over by ``reserve`` before ``allocate``:
    #: a scheduler that starts agents itself gives them over a pipe instead of naming the keys file.
    keys: Any = None

    @abc.abstractmethod
    def dryrun(self, spec: JobSpec, job_dir: str) -> AllocateRequest:
        """The request ``allocate`` would submit (no side effects)."""

    @abc.abstractmethod
    def allocate(self, request: AllocateRequest) -> str:
        """Submit; returns the job id at once (agents start in the background)."""

    @abc.abstractmethod
    def describe(self, job_id: str, job_dir: str | None = None) -> Description | None:
        """The allocation's state, or None if the scheduler does not know the job."""

    @abc.abstractmethod
    def release(self, job_id: str, job_dir: str | None = None) -> None:
        """Give the hosts back and stop their agents; safe to call twice."""

    @abc.abstractmethod
    def logs(self, job_id: str, host: int | None = None, job_dir: str | None = None) -> str:
        """The scheduler-side logs (agent start-up output) of the job."""


_BACKENDS = {
    "local": "monarch_schedulers.local",
    "slurm": "monarch_schedulers.slurm",
    "kubernetes": "monarch_schedulers.kubernetes",
}


def names() -> list[str]:
    return sorted(_BACKENDS)


def create_scheduler(name: str, **opts: Any) -> Scheduler:
    """The scheduler called ``name`` (imported only when used)."""
    import importlib

    from monarch_schedulers.errors import UsageError

    if name not in _BACKENDS:
        raise UsageError(f"unknown scheduler {name!r}", f"choose one of: {', '.join(names())}")
    return importlib.import_module(_BACKENDS[name]).create_scheduler(**opts)
