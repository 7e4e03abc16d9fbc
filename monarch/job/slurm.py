"""``SlurmJob``: hosts that are the nodes of a Slurm job (monarch's Slurm scheduler).

    job = SlurmJob(meshes={"trainers": 2}, partition="debug", time_limit="01:00:00")
    state = job.state()            # sbatch, then one host agent per node
    state.trainers                 # HostMesh of the 2 nodes
    job.kill()                     # scancel

The reservation is the one ``monarch serve --scheduler slurm --hosts 2 --partition debug --time
01:00:00 --exclusive`` makes: ``monarch status`` shows it, ``monarch run`` uses it, and a
``SlurmJob`` of the same shape reuses one that ``monarch serve`` made.

Differences from Monarch's ``SlurmJob``, on purpose:

* ``python_exe``: the nodes run the interpreter that runs this program (``sys.executable``, on the
  shared filesystem) unless another path is given; the default ``"python"`` means that one.
* ``monarch_port``, ``log_dir`` and ``job_name`` are accepted and not used: agents listen on free
  ports with CURVE keys made for the job, logs are under ``.monarch/jobs/<name>/logs/``
  (``monarch logs --scheduler``), and the Slurm job is named ``monarch-<name>``.
* ``ntasks_per_node`` must be 1 (one host agent per node; procs per node come from
  ``spawn_procs(per_host=...)``); ``out_of_cluster``/``attach_to`` (a client outside the cluster
  network) are not supported.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Sequence

from monarch.errors import UsageError
from monarch.job.job import Job
from monarch.job.process import check_meshes


class SlurmJob(Job):
    """Hosts from one ``sbatch`` job: ``meshes`` maps mesh names to numbers of nodes."""

    def __init__(
        self,
        meshes: dict[str, int],
        python_exe: str = "python",
        slurm_args: Sequence[str] = (),
        monarch_port: int = 22222,
        job_name: str = "monarch_job",
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: int | None = None,
        account: str | None = None,
        qos: str | None = None,
        out_of_cluster: bool = False,
        attach_to: str | None = None,
        bind_to: str | None = None,
    ) -> None:
        super().__init__()
        self._meshes = check_meshes(meshes, "SlurmJob")
        if ntasks_per_node != 1:
            raise UsageError(f"SlurmJob(ntasks_per_node={ntasks_per_node!r}) is not supported: monarch runs one host "
                             "agent per node", "use ntasks_per_node=1 and spawn_procs(per_host={'procs': N})")
        if out_of_cluster or attach_to is not None:
            raise UsageError("SlurmJob(out_of_cluster=/attach_to=) is not supported",
                             "run the client on a machine the nodes can reach (e.g. the login node)")
        if isinstance(slurm_args, str):
            raise ValueError(f"slurm_args must be a sequence of arguments, not a string: {slurm_args!r}")
        if bind_to is not None:
            try:
                bind_to = str(ipaddress.ip_address(bind_to))
            except ValueError:
                raise ValueError("bind_to must be an IPv4 or IPv6 address without a port") from None
        if job_start_timeout is not None and (isinstance(job_start_timeout, bool) or job_start_timeout <= 0):
            raise ValueError(f"job_start_timeout must be a positive number of seconds, got {job_start_timeout!r}")
        self._python_exe = python_exe
        #: Options of a saved reservation that the constructor does not take (constraint, client_host).
        self._extra_options: dict = {}
        self._slurm_args = tuple(slurm_args)
        self._port = monarch_port
        self._job_name = job_name
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = log_dir
        self._exclusive = bool(exclusive)
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = job_start_timeout
        self._account = account
        self._qos = qos
        self._bind_to = bind_to

    @classmethod
    def _attached(cls, meshes: dict[str, int], record: Any, path: str | None) -> "SlurmJob":
        o = dict(record.spec.options or {})
        job = cls(meshes, slurm_args=tuple(o.get("sbatch_args") or ()), time_limit=o.get("time"),
                  partition=o.get("partition"), exclusive=bool(o.get("exclusive")),
                  gpus_per_node=o.get("gpus_per_node"), account=o.get("account"), qos=o.get("qos"),
                  bind_to=o.get("bind"))
        job._python_exe = o.get("python") or "python"
        job._extra_options = {k: o[k] for k in ("constraint", "client_host") if o.get(k) is not None}
        Job.__init__(job, record, path)
        return job

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Add a mesh of ``num_nodes`` nodes to the specification (before ``apply``)."""
        self._meshes = check_meshes({**self._meshes, name: num_nodes}, "SlurmJob")

    def _job_spec(self):
        from monarch._workbench.state import JobSpec

        options: dict = dict(getattr(self, "_extra_options", {}))
        for key, value in (("partition", self._partition), ("time", self._time_limit), ("account", self._account),
                           ("qos", self._qos), ("gpus_per_node", self._gpus_per_node), ("bind", self._bind_to)):
            if value is not None:
                options[key] = value
        if self._exclusive:
            options["exclusive"] = True
        if self._python_exe not in (None, "python"):
            options["python"] = self._python_exe
        sbatch = [a for a in self._slurm_args if a.startswith("-")]  # Monarch passes on the options only
        if self._cpus_per_task is not None:
            sbatch.append(f"--cpus-per-task={self._cpus_per_task}")
        if self._mem is not None:
            sbatch.append(f"--mem={self._mem}")
        if sbatch:
            options["sbatch_args"] = sbatch
        return JobSpec("slurm", sum(self._meshes.values()), 1, options)

    def _mesh_sizes(self) -> dict[str, int]:
        return dict(self._meshes)

    def _start_timeout(self) -> float | None:
        return float(self._job_start_timeout) if self._job_start_timeout is not None else None

    def _same_spec(self, spec: Any) -> bool:
        return isinstance(spec, SlurmJob) and spec._meshes == self._meshes and self.record is not None \
            and self.record.spec.scheduler == "slurm" and spec._job_spec().compatible(self._job_spec())


__all__ = ["SlurmJob"]
