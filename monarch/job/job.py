"""PyTorch Monarch's job model: a job is a specification plus, once applied, a running allocation.

    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    state = job.state()           # reuse the cached job if it can run this spec, else apply and cache it
    state.trainers                # HostMesh of 2 hosts
    job.kill()

:class:`JobTrait` holds the lifecycle (``apply``, ``state``, ``kill``, ``dump``) and its exact cache
order; a backend implements four hooks (``_create``, ``_state``, ``can_run``, ``_kill``), which is
also how a user's own job class plugs in.  :class:`Job` is the backend for monarch reservations:
``ProcessJob`` and ``SlurmJob`` make the same reservation ``monarch serve`` makes (its state file,
its agents), so ``monarch status`` / ``run`` / ``stop`` see a job made from Python and
``job.state()`` reuses a reservation made by ``monarch serve``.

Where this differs from Monarch on purpose:

* The cache file is monarch's state file (versioned, mode 0600, written atomically), not a bare
  pickle of the job; ``job_load`` refuses a file from another version or program with one line.
* ``cached_path=".monarch/job_state.pkl"`` (the default) means the current reservation, the one
  ``monarch status`` shows: ``$MONARCH_JOB``, else the context chosen by ``monarch context use``.
* A job applied with ``cached_path=None`` can be found by no other process, so it is released
  when this process exits if it was not killed before (Monarch leaves it running).
* ``kill()`` also removes the job's state file, as ``monarch stop`` does.
"""

from __future__ import annotations

import abc
import atexit
import importlib
import logging
import os
import pickle
import signal
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence

from monarch.errors import StateError, UsageError

if TYPE_CHECKING:  # the actor runtime is imported only when a job is connected
    from monarch.actor import HostMesh
    from monarch._workbench.state import JobRecord, JobSpec

#: Where ``state()`` caches a job unless told otherwise (Monarch's default).
DEFAULT_JOB_PATH: str = ".monarch/job_state.pkl"

logger = logging.getLogger("monarch.job")
if not logger.handlers:
    # Monarch tells the user on stderr when a cached job is replaced; so do we, without their logging setup.
    _h = logging.StreamHandler(sys.stderr)
    _h.setFormatter(logging.Formatter("monarch: %(message)s"))
    logger.addHandler(_h)
    logger.setLevel(logging.INFO)
    logger.propagate = False


@dataclass
class TelemetryConfig:
    """What :meth:`JobTrait.enable_telemetry` starts at the next ``state()`` (Monarch's fields).

    ``retention_secs``: how long the job's hosts keep rows of its messages (``messages``,
    ``message_status_events``, ``sent_messages``), spans and metrics (0: as long as the rings' bounds
    allow); the other tables keep rows in bounded rings until ``monarch stop``.
    ``include_dashboard``/``dashboard_port``: monarch's dashboard is ``monarch dashboard --web
    --port N`` (not started by the job); ``snapshot_interval_secs``: how often the mesh admin tree is
    captured into Monarch's snapshot tables (``snapshots``, ``nodes``, ``actor_nodes``, ...; 0: never).
    """

    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0


def _retain(hosts: Any, retention_secs: float) -> None:
    """Monarch's retention: the job's hosts keep its message, span and metric rows only
    ``retention_secs`` (0: as long as their bounds allow).  The hosts of a shared reservation hold
    every job's rows: the last job to say sets it for them all."""
    from monarch_agents.messages import TelemetryRetain

    for h in hosts.hosts:
        try:
            hosts.rt.send(h.addr, TelemetryRetain(float(retention_secs or 0)))
        except Exception as e:  # a host gone already: it holds nothing more to bound
            logger.debug("retention not sent to %s: %s", h.host, e)


@dataclass
class MeshAdminConfig:
    """What :meth:`JobTrait.enable_admin` starts: the mesh admin HTTP API, at ``admin_addr``
    ("HOST:PORT"; default: loopback, a free port)."""

    admin_addr: Optional[str] = None


class JobState:
    """The host meshes of a running job, by the names its specification gave them.

    ``state.trainers`` is the ``HostMesh`` of the mesh called ``trainers``; an unknown name raises
    ``AttributeError`` listing the names there are.  ``query_engine``, ``query_engine_client``,
    ``telemetry_url`` and ``admin_url`` are the job's services (None unless enabled, see
    :meth:`JobTrait.enable_telemetry`); ``dashboard_url`` is always None (``monarch dashboard``).
    """

    def __init__(self, hosts: dict[str, "HostMesh"], query_engine: Any = None, query_engine_client: Any = None,
                 telemetry_url: str | None = None, dashboard_url: str | None = None, admin_url: str | None = None):
        self._hosts = hosts
        self.query_engine = query_engine
        self.query_engine_client = query_engine_client
        self.telemetry_url = telemetry_url
        self.dashboard_url = dashboard_url
        self.admin_url = admin_url

    def __getattr__(self, attr: str) -> "HostMesh":
        hosts = self.__dict__.get("_hosts")
        if hosts is None or attr.startswith("__"):
            raise AttributeError(attr)
        try:
            return hosts[attr]
        except KeyError:
            available = ", ".join(sorted(hosts))
            raise AttributeError(f"'{attr}' is not a valid host mesh name. Available names: {available}") from None

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._hosts))

    def __repr__(self) -> str:
        return f"JobState(hosts={self._hosts!r})"


class _CachedRunning(NamedTuple):
    job: "JobTrait"


class JobTrait(abc.ABC):
    """A job: a specification of host meshes and, once applied, the allocation that runs it.

    ``apply()`` brings the job into existence (a no-op if it already runs); ``state()`` returns
    its :class:`JobState`, reusing a cached running job that ``can_run`` this specification, or
    applying this one and caching it; ``kill()`` releases it.  Subclasses implement ``_create``,
    ``_state``, ``can_run`` and ``_kill``, and must not set ``_status`` themselves.
    """

    def __init__(self) -> None:
        self._status: str | _CachedRunning = "not_running"
        self._apply_id: str | None = None
        self._mount_specs: list[tuple] = []

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def _running(self) -> "JobTrait | None":
        status = self._status
        if status == "running":
            return self
        if isinstance(status, _CachedRunning):
            return status.job
        return None

    def apply(self, client_script: str | None = None) -> None:
        """Create the job as specified; a no-op when it is already running."""
        if self._running is None:
            self._create(client_script)
            self._apply_id = str(uuid.uuid4())
            self._status = "running"

    @property
    def apply_id(self) -> str | None:
        """A UUID naming the current allocation (kept across ``dump``/``job_load``); None before ``apply``."""
        running = self._running
        return running._apply_id if running is not None else None

    @property
    def active(self) -> bool:
        """Whether this job object holds an allocation (applied, loaded running, or reusing a cached one)."""
        return self._running is not None

    def state(self, cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
        """The job's host meshes, applying the job first if need be, with its mounts applied.

        If this job is not running and ``cached_path`` names a cached job that is running and
        ``can_run`` this specification, that job is used.  A cached job that cannot is killed and
        its cache removed; then this job is applied and, unless ``cached_path`` is None, cached there.
        Mounts declared with :meth:`remote_mount` and :meth:`gather_mount` are opened (or refreshed).
        """
        state = self._applied_state(cached_path)
        if getattr(self, "_mount_specs", None):
            self._apply_mounts(state)
        self._start_services(state)
        return state

    # -- telemetry and admin services --------------------------------------------------------

    def enable_telemetry(self, config: "TelemetryConfig | None" = None, *,
                         mesh_admin_config: "MeshAdminConfig | None" = None, **kwargs: Any) -> "JobTrait":
        """Serve the job's telemetry (and, unless already configured, the mesh admin API) from the
        next ``state()`` on: ``state.telemetry_url``, ``state.query_engine_client`` (``state.query_engine``
        stays None, as Monarch's), ``state.admin_url``
        (see ``monarch._workbench.job_services``).  Returns ``self``."""
        self._telemetry_config = config if config is not None else TelemetryConfig(**kwargs)
        if mesh_admin_config is not None:
            self._admin_config = mesh_admin_config
        elif getattr(self, "_admin_config", None) is None:
            self._admin_config = MeshAdminConfig()
        return self

    def enable_admin(self, config: "MeshAdminConfig | None" = None, **kwargs: Any) -> "JobTrait":
        """Serve the mesh admin HTTP API from the next ``state()`` on (``state.admin_url``).  Returns ``self``."""
        self._admin_config = config if config is not None else MeshAdminConfig(**kwargs)
        return self

    def telemetry_query_client(self) -> Any:
        """A client (``query(sql)`` -> ``{"rows": [...]}``) of the running job's telemetry service;
        started in this process if another process enabled it."""
        running = self._running
        if running is None:
            raise RuntimeError("the saved job is not active")
        if self.__dict__.get("_telemetry_config") is None and running.__dict__.get("_telemetry_config") is None:
            raise RuntimeError("the active job has no distributed telemetry configured; "
                               "call job.enable_telemetry() and apply it again")
        try:
            state = running._state()
        except Exception as e:
            raise RuntimeError(f"the active job is no longer running or healthy: {e}") from None
        if self.__dict__.get("_telemetry_config") is None:
            self._telemetry_config = running._telemetry_config
        self._start_services(state)
        return state.query_engine_client

    def _start_services(self, state: JobState) -> None:
        from monarch._workbench import job_services as js

        telemetry = self.__dict__.get("_telemetry_config")
        admin = self.__dict__.get("_admin_config")
        if telemetry is None and admin is None:
            return
        services = self.__dict__.setdefault("_services", {})
        hosts = js.hosts_of(state._hosts, self.__dict__.get("record"))
        if telemetry is not None:
            if "telemetry" not in services:
                services["telemetry"] = js.JobServer(hosts, telemetry=True, admin=False)
            server = services["telemetry"]
            state.telemetry_url = server.url
            # Monarch serves telemetry from a sidecar: its JobState.query_engine stays None and programs
            # ask query_engine_client (Meta's telemetry tests assert exactly that).
            state.query_engine = None
            state.query_engine_client = js.QueryEngineClient(server.url)
            if hosts.hosts and hosts.rt is not None:
                # The client's own rows (its <root> actor, spans and metrics recorded before it spawns a
                # proc) are queryable from now on, as Monarch's are, not from its first spawn_procs.
                from monarch.actor import _telemetry

                _telemetry.root_actor(hosts.rt)
                _telemetry.push_to(hosts.rt, hosts.hosts[0].addr)
                _retain(hosts, telemetry.retention_secs)
                if telemetry.snapshot_interval_secs and telemetry.snapshot_interval_secs > 0 \
                        and "snapshots" not in services:
                    services["snapshots"] = js.SnapshotTimer(hosts, float(telemetry.snapshot_interval_secs))
        if admin is not None:
            if "admin" not in services:
                from monarch import config

                # MeshAdminConfig's address, else monarch.config's mesh_admin_addr (ours: loopback).
                bind, port = js.parse_bind(admin.admin_addr or config.get_global_config()["mesh_admin_addr"])
                services["admin"] = js.JobServer(hosts, telemetry=False, admin=True, bind=bind, port=port)
                services["admin"].announce_admin()
            state.admin_url = services["admin"].url

    def _stop_services(self) -> None:
        for server in self.__dict__.pop("_services", {}).values():
            server.close()

    # -- mounts ----------------------------------------------------------------------------

    def remote_mount(self, source: str, mntpoint: str | None = None, meshes: list[str] | None = None,
                     python_exe: str | None = ".venv/bin/python", **kwargs: Any) -> None:
        """Declare a local folder to mount read-only on the hosts (see ``monarch.remotemount``).

        Nothing happens now: the mount is opened at the next :meth:`state`, and refreshed (only
        changes travel) at every later one.  ``meshes`` limits it to those meshes (default: all).
        ``python_exe`` is accepted for Monarch compatibility (the hosts' interpreter is not changed).
        """
        self._mount_specs = [*getattr(self, "_mount_specs", []), ("remote", source, mntpoint, meshes)]

    def gather_mount(self, remote_mount_point: str, local_mount_point: str, meshes: list[str] | None = None) -> None:
        """Declare a folder of every host to show here read-only (see ``monarch.gather_mount``), at the next :meth:`state`.

        With several meshes, each mesh's hosts appear under ``local_mount_point/<mesh name>``.
        """
        self._mount_specs = [*getattr(self, "_mount_specs", []),
                             ("gather", remote_mount_point, local_mount_point, meshes)]

    def _apply_mounts(self, state: JobState) -> None:
        from monarch.gather_mount import gather_mount
        from monarch.remotemount import remotemount

        handles = self.__dict__.setdefault("_mount_handles", {})
        meshes = state._hosts
        for spec in self._mount_specs:
            kind, a, b, names = spec
            chosen = [n for n in meshes if names is None or n in names]
            for n in chosen:
                key = (spec, n)
                h = handles.get(key)
                if kind == "remote":
                    if h is None:
                        h = handles[key] = remotemount(meshes[n], a, b)
                        h.open()
                    else:
                        h.refresh()
                elif h is None:
                    local = b if len(chosen) == 1 else os.path.join(b, n)
                    handles[key] = gather_mount(meshes[n], a, local)

    def close_mounts(self) -> None:
        """Close the mounts this process opened (remote mounts are unmounted on the hosts)."""
        for h in self.__dict__.pop("_mount_handles", {}).values():
            h.close()

    def _applied_state(self, cached_path: str | None) -> JobState:
        running = self._running
        if running is not None:
            return running._state()
        path = _resolve_cache_path(cached_path)
        cached = self._load_cached(path)
        if cached is not None:
            self._status = _CachedRunning(cached)
            return cached._state()
        self._cache_target = path
        try:
            self.apply()
        finally:
            self._cache_target = None
        if path is None:
            _release_at_exit(self)
        state = self._state()
        if path is not None:
            self.dump(path)
        return state

    def _load_cached(self, path: str | None) -> "JobTrait | None":
        if path is None or not os.path.exists(path):
            return None
        job = job_load(path)  # another version or program: StateError, the file is left alone
        running = job._running
        if running is None:
            return None
        if not running.can_run(self):
            logger.info("the job cached at %s (%s) cannot run this %s: releasing it and applying anew",
                        _rel(path), running._describe(), type(self).__name__)
            try:
                running._kill()
            except Exception as e:  # a stale cache must not block every later state()
                logger.warning("releasing the cached job failed (%s); removing its cache anyway", e)
            _remove(os.path.realpath(path))
            return None
        return job

    def kill(self) -> None:
        """Release the allocation (safe to repeat)."""
        running = self._running
        self._stop_services()
        if running is not None:
            running._kill()
        self._status = "not_running"

    # -- persistence -----------------------------------------------------------------------

    def dump(self, filename: str) -> None:
        """Save the job to ``filename`` (a monarch state file, mode 0600; a symlink is followed)."""
        from monarch._workbench.state import write_atomic

        path = os.path.realpath(filename) if os.path.islink(filename) else filename
        write_atomic(os.path.abspath(path), self.dumps())

    def dumps(self) -> bytes:
        """The job as bytes, for :func:`job_loads`."""
        from monarch._workbench.state import state_bytes

        return state_bytes(None, pickle.dumps(self, protocol=5), type(self).__name__)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_cache_target", None)
        state.pop("_mount_handles", None)  # live mounts belong to the process that opened them
        state.pop("_services", None)  # so do its HTTP servers
        return state

    def _describe(self) -> str:
        return type(self).__name__

    # -- what a backend implements ------------------------------------------------------------

    @abc.abstractmethod
    def _create(self, client_script: str | None) -> None:
        """Allocate the job (called by ``apply`` when it is not running)."""

    @abc.abstractmethod
    def _state(self) -> JobState:
        """The running job's host meshes."""

    @abc.abstractmethod
    def can_run(self, spec: "JobTrait") -> bool:
        """Whether this (running) job can serve ``spec`` instead of a new allocation."""

    @abc.abstractmethod
    def _kill(self) -> None:
        """Release the allocation."""


# -- jobs backed by a monarch reservation ---------------------------------------------------------


class Job(JobTrait):
    """A job whose allocation is a monarch reservation (the kind ``monarch serve`` makes).

    A subclass says what to reserve (``_job_spec``) and how its hosts split into named meshes
    (``_mesh_sizes``); reserving, waiting for the agents, reuse and release are done here.
    ``Job(record, path)`` wraps a reservation already made (that is what ``job_load`` gives back
    for a reservation made by ``monarch serve``).
    """

    record: JobRecord | None
    path: str | None

    def __init__(self, record: "JobRecord | None" = None, path: str | None = None):
        super().__init__()
        self.record = record
        self.path = path
        if record is not None:
            self._status = "running"
            self._apply_id = _apply_uuid(record)

    def apply(self, client_script: str | None = None) -> None:
        super().apply(client_script)
        if self.record is not None and self._status == "running":
            # The same allocation has the same apply_id in every process that loads it.
            self._apply_id = _apply_uuid(self.record)

    # what a subclass says
    def _job_spec(self) -> "JobSpec":
        if self.record is None:
            raise UsageError(f"{type(self).__name__} has no specification to apply")
        return self.record.spec

    def _mesh_sizes(self) -> dict[str, int]:
        n = self.record.spec.hosts if self.record is not None else self._job_spec().hosts
        return {"hosts": n}

    def _same_spec(self, spec: "JobTrait") -> bool:
        return type(spec) is type(self) and spec._mesh_sizes() == self._mesh_sizes() and \
            spec._job_spec().compatible(self._job_spec())

    def _start_timeout(self) -> float | None:
        return None

    # the hooks
    def _create(self, client_script: str | None) -> None:
        from monarch._workbench.reserve import allocate
        from monarch._workbench.state import StatePaths

        if client_script is not None:
            raise UsageError(f"{type(self).__name__}.apply(client_script=...) (batch mode) is not supported",
                             f"reserve with job.apply() and run the script with `monarch run {client_script}`")
        spec = self._job_spec()
        sizes = self._mesh_sizes()
        if sum(sizes.values()) != spec.hosts or any(n < 1 for n in sizes.values()):
            raise UsageError(f"bad mesh sizes {sizes}", "each mesh needs a positive number of hosts")
        path = getattr(self, "_cache_target", None)
        paths = StatePaths()
        if path is None:
            # Not cached: a private job folder and state file nobody else reads (released at exit).
            name = f"py-{uuid.uuid4().hex[:10]}"
            job_dir = paths.job_dir(name)
            path = os.path.join(job_dir, "job_state.pkl")
        else:
            name, job_dir = _name_and_dir(path, paths)
        blob = pickle.dumps(_spec_only(self), protocol=5)
        self.record = allocate(spec, name=name, path=path, job_dir=job_dir, timeout=self._start_timeout(),
                               job=blob)
        self.path = path

    def _state(self) -> JobState:
        from monarch._workbench.reserve import load_live

        if self.record is None or self.path is None:
            raise StateError(f"{type(self).__name__} is not running", "call job.apply() or job.state()")
        self.record, self.path = load_live(path=self.path)
        return JobState(_host_meshes(self.record, self._mesh_sizes()))

    def can_run(self, spec: JobTrait) -> bool:
        from monarch._workbench.reserve import describe

        if self.record is None or not self._same_spec(spec):
            return False
        d = describe(self.record)
        if d is None or not d.state.alive:
            why = d.reason if d is not None and d.reason else "the scheduler no longer knows it"
            logger.info("the cached reservation %s is gone: %s", self.record.job_id, why)
            return False
        return True

    def _kill(self) -> None:
        from monarch._workbench.reserve import release
        from monarch._workbench.state import load_state

        if self.record is None:
            return
        if "monarch.actor._mesh" in sys.modules:
            # Procs this process started there end as stopped, not as failures of their owner.
            from monarch.actor._hostmesh_extras import stop_procs_on

            stop_procs_on({h.addr for h in self.record.hosts})
        path = self.path
        if path is not None:
            try:
                if load_state(path).job_id != self.record.job_id:
                    path = None  # the file names another reservation by now: leave it
            except StateError:
                path = None
        release(self.record, path)

    def _describe(self) -> str:
        if self.record is None:
            return type(self).__name__
        return f"{type(self).__name__} {self.record.job_id}, {self.record.spec.summary()}"

    def dumps(self) -> bytes:
        """The job as bytes: its reservation (as ``monarch serve`` writes it) and the job object."""
        import dataclasses

        from monarch._workbench.state import state_bytes

        if self.record is None:
            return super().dumps()
        record = self.record
        if record.job is None and type(self) is not Job and record.program is None:
            record = dataclasses.replace(record, job=pickle.dumps(_spec_only(self), protocol=5))
        return state_bytes(record)

    def __repr__(self) -> str:
        return f"<{self._describe()}>"

    def query(self, sql: str, *, limit: int | None = None, timeout: float = 10.0, strict: bool = False) -> Any:
        """Run ``sql`` over the telemetry of every host of the job; returns a ``pyarrow.Table``.

        Hosts that did not answer in time are listed, as JSON, in the table's schema metadata
        under ``b"missing_hosts"`` (``strict=True`` raises instead).  ``limit`` caps the rows
        (default: all).  ``monarch query --tables`` lists the tables and their columns.
        """
        import json

        from monarch._workbench.reserve import load_live
        from monarch._workbench.telemetry import query

        if self.record is None or self.path is None:
            raise StateError(f"{type(self).__name__} is not running", "call job.apply() or job.state()")
        self.record, self.path = load_live(path=self.path)
        result = query(self.record, sql, row_limit=limit, timeout_s=timeout, strict=strict)
        meta = {**(result.table.schema.metadata or {}), b"missing_hosts": json.dumps(result.missing_hosts).encode()}
        return result.table.replace_schema_metadata(meta)

    # Kept from monarch's first job API: the reservation's whole host mesh.
    def host_mesh(self) -> "HostMesh":
        """Every host of the reservation as one mesh (``{hosts: N}``)."""
        from monarch._workbench.reserve import load_live

        if self.record is None or self.path is None:
            raise StateError(f"{type(self).__name__} is not running", "call job.apply() or job.state()")
        self.record, self.path = load_live(path=self.path)
        return _host_meshes(self.record, {"hosts": self.record.spec.hosts})["hosts"]


def _apply_uuid(record: "JobRecord") -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"monarch-job:{record.job_id}@{record.created_at!r}"))


def _spec_only(job: Job) -> Job:
    """A copy of ``job`` without its running state: what a state file keeps of the job object."""
    clone = object.__new__(type(job))
    clone.__dict__.update(job.__getstate__())
    clone.record = None
    clone.path = None
    clone._status = "not_running"
    clone._apply_id = None
    return clone


def host_mesh_of(record: "JobRecord") -> "HostMesh":
    """A reservation's hosts as one ``HostMesh`` of dims ``{hosts: N}`` (one host too, as in Monarch).

    Built here, in the API layer, from the record's data: the record (``monarch._workbench.state``)
    is data and builds no API object."""
    return _host_meshes(record, {"hosts": len(record.hosts)})["hosts"]


def _host_meshes(record: "JobRecord", sizes: dict[str, int]) -> dict[str, "HostMesh"]:
    """The reservation's hosts split, in host-rank order, into meshes of ``sizes`` (``{hosts: n}`` each)."""
    from monarch.actor._client import HostRef
    from monarch.actor._mesh import HostMesh
    from monarch.actor._shape import Shape

    record.runtime()
    hosts = [HostRef(h.addr, h.host, h.host_rank) for h in sorted(record.hosts, key=lambda h: h.host_rank)]
    out, i = {}, 0
    for name, n in sizes.items():
        out[name] = HostMesh(hosts[i:i + n], Shape(("hosts",), (n,)))
        i += n
    return out


def _name_and_dir(path: str, paths: Any) -> tuple[str, str]:
    """The context name and job folder for a state file: ``monarch status --name`` finds the named ones."""
    from monarch._workbench.state import DEFAULT_CONTEXT, MONARCH_CONTEXT_STATE

    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if os.path.basename(path) == MONARCH_CONTEXT_STATE and os.path.dirname(folder) == paths.root:
        # PyTorch Monarch's context layout (.monarch/NAME/state.pkl): the context is NAME.
        try:
            name = paths.check_name(os.path.basename(folder))
            return name, paths.job_dir(name)
        except StateError:
            pass
    if folder == paths.root:
        base = os.path.basename(path)
        if base == "job_state.pkl":
            return DEFAULT_CONTEXT, paths.job_dir(DEFAULT_CONTEXT)
        if base.endswith(".job_state.pkl"):
            name = base[: -len(".job_state.pkl")]
            try:
                return name, paths.job_dir(paths.check_name(name))
            except StateError:
                pass
    import hashlib

    stem = os.path.basename(path).split(".")[0] or "job"
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in stem)[:40].strip("-_") or "job"
    # Job folders live under this directory's .monarch/jobs/ whatever the state file's path.
    return name, paths.job_dir(f"{name}-{hashlib.sha1(path.encode()).hexdigest()[:8]}")


def _resolve_cache_path(cached_path: str | None) -> str | None:
    if cached_path is None:
        return None
    if os.path.normpath(cached_path) == os.path.normpath(DEFAULT_JOB_PATH):
        from monarch._workbench.state import StatePaths

        return StatePaths().resolve(None)
    return os.path.abspath(cached_path)


_exit_jobs: list[JobTrait] = []
_exit_lock = threading.Lock()


def _release_at_exit(job: JobTrait) -> None:
    with _exit_lock:
        if not _exit_jobs:
            atexit.register(_release_uncached)
        _exit_jobs.append(job)


def _release_uncached() -> None:
    from monarch_agents import runtime

    for rt in runtime.client_runtimes():
        rt.stopping = True  # the procs dying with the job now are expected, not failures
    for job in list(_exit_jobs):
        try:
            if job.active:
                job.kill()
        except Exception as e:
            print(f"monarch: releasing an uncached job at exit failed: {e}", file=sys.stderr)
    _exit_jobs.clear()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


# -- loading ----------------------------------------------------------------------------------


def job_loads(data: bytes) -> JobTrait:
    """The job in ``data`` (from :meth:`JobTrait.dumps`)."""
    from monarch._workbench.state import parse_payload

    return _job_from_payload(parse_payload(data, "the job bytes"), None)


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """The job saved at ``filename`` (default: the current reservation, as for ``monarch status``).

    A reservation made by ``monarch serve`` comes back as a running ``ProcessJob({"hosts": N})``
    (local), ``SlurmJob(meshes={"hosts": N}, ...)`` or ``KubernetesJob`` (one mesh ``hosts``); one made by ``monarch.job.spmd.serve`` as
    an ``SPMDJob``.  Raises ``FileNotFoundError`` if there is no file, and
    ``monarch.errors.StateError`` (one line, with the fix) for a file of another version or program.
    """
    from monarch._workbench.state import load_payload

    path = _resolve_cache_path(filename) if filename is not None else _resolve_cache_path(DEFAULT_JOB_PATH)
    assert path is not None
    if not os.path.exists(path):
        raise FileNotFoundError(f"no job saved at {_rel(path)} (run `monarch serve` or job.state() first)")
    return _job_from_payload(load_payload(path), path)


def _job_from_payload(payload: dict, path: str | None) -> JobTrait:
    from monarch._workbench.state import JobRecord

    where = _rel(path) if path else "the job bytes"
    state, blob = payload.get("state"), payload.get("job")
    if state is None:
        if blob is None:
            raise StateError(f"{where} holds no job", "`monarch serve` or job.state() makes one")
        return _unpickle_job(blob, where)
    try:
        record = JobRecord.from_dict(state)
    except Exception:
        raise StateError(f"state file {where} is corrupt", "remove it with `monarch stop --force`") from None
    return job_for_record(record, path)


def job_for_record(record: "JobRecord", path: str | None) -> Job:
    """The running job object of a reservation: the job it was made for, else one for its scheduler."""
    if record.job is not None:
        job = _unpickle_job(record.job, _rel(path) if path else "the job bytes")
        if not isinstance(job, Job):
            raise StateError(f"the reservation {record.job_id} names a {type(job).__name__}, not a monarch job")
        Job.__init__(job, record, path)
        return job
    if record.program is not None:
        from monarch.job.spmd import SPMDJob

        return SPMDJob(record, path)
    if record.spec.scheduler == "local":
        from monarch.job.process import ProcessJob

        return ProcessJob._attached({"hosts": record.spec.hosts}, record, path)
    if record.spec.scheduler == "slurm":
        from monarch.job.slurm import SlurmJob

        return SlurmJob._attached({"hosts": record.spec.hosts}, record, path)
    if record.spec.scheduler == "kubernetes":
        from monarch.job.kubernetes import KubernetesJob

        return KubernetesJob._attached({"hosts": record.spec.hosts}, record, path)
    return Job(record, path)


def _unpickle_job(blob: bytes, where: str) -> JobTrait:
    try:
        job = pickle.loads(blob)
    except (ModuleNotFoundError, AttributeError, ImportError) as e:
        raise StateError(f"{where} holds a job whose class this program cannot import ({e})",
                         "import the module that defines it first, or remove the file") from None
    except Exception as e:
        raise StateError(f"{where} holds a job that cannot be loaded ({type(e).__name__}: {e})",
                         "remove the file and apply the job again") from None
    if not isinstance(job, JobTrait):
        raise StateError(f"{where} holds a {type(job).__name__}, not a job", "remove the file")
    return job


# -- the current job (``monarch apply``-style contexts) --------------------------------------------


def _spec_file() -> str:
    from monarch._workbench.state import StatePaths

    paths = StatePaths()
    return os.path.join(paths.root, "specs", paths.current())


def set_current_job(module_path: str) -> None:
    """Remember ``module.attr`` (a ``JobTrait`` object) as the job of the current context."""
    from monarch._workbench.state import write_atomic

    if not isinstance(module_path, str) or "." not in module_path:
        raise ValueError(f"module_path must be 'module.attr', got {module_path!r}")
    write_atomic(_spec_file(), module_path.encode())


def load_current_job() -> JobTrait:
    """A fresh job object from the current context's ``module.attr`` (see :func:`set_current_job`).

    Not connected: call ``.state()`` on it (which reuses the cached job when it can).
    """
    path = _spec_file()
    try:
        with open(path) as f:
            module_path = f.read().strip()
    except FileNotFoundError:
        raise FileNotFoundError(f"No spec found at {_rel(path)}. Call monarch.job.set_current_job('module.attr') first.") \
            from None
    return job_at(module_path)


def job_at(module_path: str) -> JobTrait:
    """The job object ``module.attr`` names (the module is imported); a clear error when it is not one."""
    mod_name, _, attr = module_path.rpartition(".")
    if not mod_name or not attr:
        raise ValueError(f"module_path must be 'module.attr', got {module_path!r}")
    job = getattr(importlib.import_module(mod_name), attr, None)
    if job is None:
        raise AttributeError(f"Module '{mod_name}' has no '{attr}' attribute")
    if not isinstance(job, JobTrait):
        raise TypeError(f"'{module_path}' must be a JobTrait, got {type(job).__name__}")
    return job


# -- LocalJob ----------------------------------------------------------------------------------


class LocalJob(JobTrait):
    """This machine as every host mesh: ``state().<name>`` is ``this_host()``.

    A stand-in so a program can switch between a real job and local execution by configuration.
    Like Monarch's, it never reuses a cached job (``can_run`` is False), so its ``state()``
    releases a different cached job at ``cached_path``.
    """

    def __init__(self, hosts: Sequence[str] = ("hosts",)):
        super().__init__()
        if isinstance(hosts, str):
            hosts = (hosts,)
        self._host_names = tuple(hosts)

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise UsageError("LocalJob.apply(client_script=...) (batch mode) is not supported",
                             f"run it as `python {client_script}`")

    def _state(self) -> JobState:
        from monarch.actor import this_host

        return JobState({name: this_host() for name in self._host_names})

    def can_run(self, spec: JobTrait) -> bool:
        return False

    def _kill(self) -> None:
        pass


# -- LoginJob -----------------------------------------------------------------------------------


class ProcessState(NamedTuple):
    """A worker a ``LoginJob`` started: its process id, and the address its worker loop serves."""

    pid: int
    channel: str


class LoginJob(JobTrait):
    """Hosts given by name, each reached by a worker the subclass starts (``_start_host``: log in,
    run a worker loop, return its ``ProcessState``); the job attaches to those workers.

    Monarch's base of its SSH job, kept for programs that subclass it; a reservation of monarch's
    goes through a scheduler instead (``ProcessJob``, ``SlurmJob``, ...).

    It attaches with ``ca="trust_all_connections"``, as Monarch's does.  In Monarch that means no
    certificate authority checks the workers; here it does not mean any peer is trusted: each worker
    and this client prove the user's worker secret (``~/.monarch/worker.key``, 0600) to each other
    before the job's keys go to the worker, sealed (see ``attach_to_workers``), and there is no
    setting that skips this.  So a worker ``_start_host`` starts on another machine needs the same
    secret: a shared home has it; otherwise copy the file (mode 0600) or mount it there and name it
    in the worker's environment with ``MONARCH_WORKER_SECRET_FILE`` (a path, never the secret itself).
    A program of another user at a worker's address gets a nonce and nothing else, and the host
    mesh's ``initialized`` says the worker did not prove the secret.
    """

    def __init__(self) -> None:
        super().__init__()
        self._meshes: dict[str, list[str]] = {}
        self._host_to_pid: dict[str, ProcessState] = {}

    def add_mesh(self, name: str, hosts: list[str]) -> None:
        """A host mesh called ``name`` of these hosts (one worker each)."""
        self._meshes[name] = list(hosts)

    @abc.abstractmethod
    def _start_host(self, host: str) -> ProcessState:
        """Start the worker of ``host`` (it serves ``run_worker_loop_forever(address=...)``)."""

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise RuntimeError("LoginJob cannot run batch-mode scripts")  # Monarch's error
        for hosts in self._meshes.values():
            for host in hosts:
                self._host_to_pid[host] = self._start_host(host)

    def _state(self) -> JobState:
        from monarch.actor import attach_to_workers

        if not self._pids_active():
            raise RuntimeError("lost connection: a worker of this job is gone")
        return JobState({name: attach_to_workers(name=name, ca="trust_all_connections",
                                                 workers=[self._host_to_pid[h].channel for h in hosts])
                         for name, hosts in self._meshes.items()})

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this job, still running every worker, serves ``spec`` (the same meshes of the same hosts)."""
        return isinstance(spec, LoginJob) and spec._meshes == self._meshes and self._pids_active()

    def _pids_active(self) -> bool:
        if not self.active:
            return False
        for p in self._host_to_pid.values():
            try:
                os.kill(p.pid, 0)
            except OSError:
                return False
        return True

    def _kill(self) -> None:
        for p in self._host_to_pid.values():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except OSError:
                pass
