"""``KubernetesJob``: hosts that are pods (monarch's Kubernetes scheduler), as PyTorch Monarch's
``monarch.job.kubernetes``.

    from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

    job = KubernetesJob(namespace="default", kubeconfig=KubeConfig.from_path("~/.kube/config"))
    job.add_mesh("trainers", 2, image_spec=ImageSpec("ghcr.io/me/monarch:latest",
                                                     resources={"nvidia.com/gpu": 4}))
    state = job.state()              # pods made once (a MonarchMesh where its CRD is installed)
    state.trainers                   # HostMesh of the 2 pods
    job.kill()

The reservation is the one ``monarch serve --scheduler kubernetes`` makes (``monarch status``,
``run`` and ``stop`` see it).  Meshes added without ``image_spec``/``pod_template`` adopt pods
that already run the agent (labelled ``monarch.pytorch.org/mesh-name=<name>``, keys in the
Secret ``<name>-keys``), as ``monarch serve --attach <name>`` does.

Differences from Monarch's, on purpose: all meshes of one job share one pod spec (they are one
reservation, split in order), and an adopted mesh must be the job's only mesh;
``label_selector``/``pod_rank_label`` other than the defaults, ``attach_to`` (a gateway for a
client outside the cluster network) and ``ImageSpec.enable_fuse`` are not supported;
``labels``/``annotations`` of the MonarchMesh object are accepted and not applied.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from monarch.errors import UsageError
from monarch.job.job import Job
from monarch.job.process import check_meshes

_DEFAULT_PORT = 26600
_RANK_LABEL = "apps.kubernetes.io/pod-index"


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """The container image (and resource limits, e.g. ``{"nvidia.com/gpu": 4}``) of a mesh's pods."""

    image: str
    resources: dict[str, str | int] | None = None
    enable_fuse: bool = False
    shared_memory_size: str | None = None


@dataclasses.dataclass(frozen=True)
class KubeConfig:
    """Where the cluster is: a kubeconfig file (``KubeConfig.from_path``), else the defaults
    (``$KUBECONFIG``, ``~/.kube/config``, or the in-cluster service account)."""

    local: str | None = None
    context: str | None = None

    @classmethod
    def from_path(cls, path: str, context: str | None = None) -> "KubeConfig":
        return cls(local=os.path.expanduser(str(path)), context=context)


class KubernetesJob(Job):
    """Meshes of pods in ``namespace``; add them with :meth:`add_mesh` before ``state()``."""

    def __init__(self, namespace: str, timeout: int | None = None, kubeconfig: KubeConfig | str | None = None,
                 attach_to: str | None = None) -> None:
        super().__init__()
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"namespace must be a Kubernetes namespace name, got {namespace!r}")
        if attach_to is not None:
            raise UsageError("KubernetesJob(attach_to=...) is not supported: monarch reaches pods directly",
                             "run the client where pod IPs are routable (inside the cluster, or a routed network)")
        if timeout is not None and (isinstance(timeout, bool) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(kubeconfig, str):
            kubeconfig = KubeConfig.from_path(kubeconfig)
        self._namespace = namespace
        self._timeout = timeout
        self._kubeconfig = kubeconfig or KubeConfig()
        self._meshes: dict[str, int] = {}
        self._mesh_options: dict[str, dict] = {}

    def add_mesh(self, name: str, num_replicas: int, label_selector: str | None = None,
                 pod_rank_label: str = _RANK_LABEL, image_spec: ImageSpec | None = None, port: int = _DEFAULT_PORT,
                 pod_template: Any = None, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None) -> None:
        """Add a mesh of ``num_replicas`` pods: made from ``image_spec``/``pod_template``, or (neither
        given) adopted from pods labelled ``monarch.pytorch.org/mesh-name=<name>``."""
        meshes = check_meshes({**self._meshes, name: num_replicas}, "KubernetesJob")
        if label_selector is not None and label_selector != f"monarch.pytorch.org/mesh-name={name}":
            raise UsageError(f"add_mesh(label_selector={label_selector!r}) is not supported",
                             f"label the pods monarch.pytorch.org/mesh-name={name}")
        if pod_rank_label != _RANK_LABEL:
            raise UsageError(f"add_mesh(pod_rank_label={pod_rank_label!r}) is not supported",
                             f"ranks come from the {_RANK_LABEL} label")
        if image_spec is not None and pod_template is not None:
            raise ValueError("image_spec and pod_template are mutually exclusive")
        options: dict = {"port": int(port)} if port != _DEFAULT_PORT else {}
        if image_spec is not None:
            if image_spec.enable_fuse:
                raise UsageError("ImageSpec(enable_fuse=True) is not supported",
                                 "monarch mounts workspaces through its agents (`monarch serve --workspace`)")
            options["image"] = image_spec.image
            for key, value in (image_spec.resources or {}).items():
                target = {"cpu": "cpu", "memory": "memory", "nvidia.com/gpu": "gpus_per_host"}.get(key)
                if target is None:
                    raise UsageError(f"resource {key!r} is not supported", "use cpu, memory or nvidia.com/gpu")
                options[target] = value
        elif pod_template is not None:
            options["pod_template"] = _pod_spec(pod_template)
            options["image"] = _first_image(options["pod_template"])
        else:
            options["attach"] = name
        if ("attach" in options and len(meshes) > 1) or any("attach" in o for o in self._mesh_options.values()):
            raise UsageError("an adopted mesh (no image_spec or pod_template) must be the job's only mesh",
                             "make a KubernetesJob per adopted mesh")
        for other, opts in self._mesh_options.items():
            if opts != options:
                raise UsageError(f"mesh {name!r} has another pod spec than mesh {other!r}; one job is one set of pods",
                                 "give the meshes the same image_spec, or make a job per spec")
        self._meshes = meshes
        self._mesh_options[name] = options

    @classmethod
    def _attached(cls, meshes: dict[str, int], record: Any, path: str | None) -> "KubernetesJob":
        o = dict(record.spec.options or {})
        job = cls(o.pop("namespace", None) or "default",
                  kubeconfig=KubeConfig(o.pop("kubeconfig", None), o.pop("context", None)))
        job._meshes = dict(meshes)
        job._mesh_options = {name: dict(o) for name in meshes}
        Job.__init__(job, record, path)
        return job

    def _job_spec(self):
        from monarch.job.state import JobSpec

        if not self._meshes:
            raise UsageError("KubernetesJob has no meshes", "call job.add_mesh(name, num_replicas, ...) first")
        options: dict = dict(next(iter(self._mesh_options.values())))
        options["namespace"] = self._namespace
        if self._kubeconfig.local:
            options["kubeconfig"] = self._kubeconfig.local
        if self._kubeconfig.context:
            options["context"] = self._kubeconfig.context
        return JobSpec("kubernetes", sum(self._meshes.values()), 1, options)

    def _mesh_sizes(self) -> dict[str, int]:
        return dict(self._meshes)

    def _start_timeout(self) -> float | None:
        return float(self._timeout) if self._timeout is not None else None

    def _same_spec(self, spec: Any) -> bool:
        return isinstance(spec, KubernetesJob) and spec._meshes == self._meshes and self.record is not None \
            and self.record.spec.scheduler == "kubernetes" and spec._job_spec().compatible(self._job_spec())


def _pod_spec(template: Any) -> dict:
    """A ``V1PodTemplateSpec`` (or its dict) as the pod spec dict the scheduler merges under its own."""
    if not isinstance(template, dict):
        from kubernetes import client

        template = client.ApiClient().sanitize_for_serialization(template)
    spec = template.get("spec", template)
    if not isinstance(spec, dict) or not spec.get("containers"):
        raise ValueError("pod_template needs a spec with at least one container")
    return spec


def _first_image(spec: dict) -> str:
    image = spec["containers"][0].get("image")
    if not image:
        raise ValueError("pod_template's first container has no image")
    return image


__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]
