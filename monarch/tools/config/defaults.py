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
    from torchx.schedulers import docker_scheduler, kubernetes_scheduler, local_scheduler, slurm_scheduler

    return {
        "local_cwd": local_scheduler.create_scheduler,
        "local_docker": docker_scheduler.create_scheduler,
        "slurm": slurm_scheduler.create_scheduler,
        "k8s": kubernetes_scheduler.create_scheduler,
    }


def dryrun_info_formatter(dryrun_info: Any) -> Callable[..., str]:
    """How ``create(config)`` with ``config.dryrun`` prints the request: TorchX's own formatter."""
    return dryrun_info._fmt
