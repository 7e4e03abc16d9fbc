"""PyTorch Monarch's ``monarch.tools.config.defaults``: the TorchX schedulers
``monarch.tools.commands`` submits to, and how a dry run prints."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["component_fn", "dryrun_info_formatter", "scheduler_factories"]


def component_fn(scheduler: str) -> Callable[..., Any]:
    """The TorchX component (a function returning an ``AppDef``) used for ``scheduler`` when none is
    given.  There is none, as in Monarch's open-source build: a ``Config`` names its ``appdef``."""
    raise NotImplementedError(f"no default component_fn for scheduler {scheduler!r}; "
                              "give Config(appdef=...) a TorchX AppDef of your own")


def scheduler_factories() -> dict[str, Any]:
    """Scheduler name -> TorchX factory: ``local_cwd``, ``local_docker`` (one machine), ``slurm``
    and ``k8s`` (several hosts)."""
    from torchx.schedulers import docker_scheduler, kubernetes_scheduler, local_scheduler

    return {
        "local_cwd": local_scheduler.create_scheduler,
        "local_docker": docker_scheduler.create_scheduler,
        "slurm": _create_slurm_scheduler,
        "k8s": kubernetes_scheduler.create_scheduler,
    }


def dryrun_info_formatter(dryrun_info: Any) -> Callable[..., str]:
    """How ``create(config)`` with ``config.dryrun`` prints the request: TorchX's own formatter."""
    return dryrun_info._fmt


def _create_slurm_scheduler(session_name: str, **kwargs: Any) -> Any:
    """TorchX's Slurm scheduler, with a ``describe`` that also works on a cluster without accounting.

    TorchX 0.7.0 describes a job (``info``, ``status``, and ``cancel``, which asks the status first)
    only from ``sacct``, which fails where Slurm keeps no accounting (``AccountingStorageType=
    accounting_storage/none``, as on our test clusters).  There a live job is described from
    ``squeue`` instead (each host of a mesh is one component of the heterogeneous job TorchX
    submits, named ``<role>-<replica>``), hostnames included; a job squeue no longer lists is unknown.
    """
    import subprocess

    from torchx.schedulers.api import DescribeAppResponse
    from torchx.schedulers.slurm_scheduler import SLURM_STATES, SlurmScheduler
    from torchx.specs import AppState, ReplicaStatus, Role, RoleStatus

    class _Scheduler(SlurmScheduler):
        def describe(self, app_id: str) -> Any:
            try:
                return super().describe(app_id)
            except (subprocess.CalledProcessError, FileNotFoundError):
                pass
            r = subprocess.run(["squeue", "-h", "-j", app_id, "-o", "%i|%j|%T|%N"], capture_output=True, text=True)
            if r.returncode != 0:
                return None
            roles: dict[str, Any] = {}
            statuses: dict[str, Any] = {}
            worst = None
            for line in r.stdout.splitlines():
                job, name, native, nodes = (line.split("|") + ["", "", "", ""])[:4]
                if job.split("+")[0] != app_id:
                    continue
                role, _, replica = name.rpartition("-")
                if not role or not replica.isdigit():
                    continue
                # COMPLETING (ending) is not in TorchX's table: the job is still there, not done.
                state = SLURM_STATES.get(native, AppState.RUNNING if native == "COMPLETING" else AppState.UNKNOWN)
                worst = state if worst is None else min(worst, state)
                roles.setdefault(role, Role(name=role, num_replicas=0, image=""))
                roles[role].num_replicas += 1
                statuses.setdefault(role, RoleStatus(role, []))
                statuses[role].replicas.append(ReplicaStatus(id=int(replica), role=role, state=state,
                                                             hostname=nodes if nodes and nodes != "(null)" else ""))
            if worst is None:
                return None
            return DescribeAppResponse(app_id=app_id, roles=list(roles.values()),
                                       roles_statuses=list(statuses.values()), state=worst, msg=worst.name)

    return _Scheduler(session_name=session_name)
