"""``KubernetesJob``: hosts that are pods (monarch's Kubernetes scheduler), as in PyTorch Monarch.

    job = KubernetesJob(namespace="default", kubeconfig=KubeConfig.from_path("~/.kube/config"))
    job.add_mesh("trainers", 2, image_spec=ImageSpec("ghcr.io/me/monarch:latest",
                                                     resources={"nvidia.com/gpu": 8}))
    state = job.state()            # pods created once, one host agent in each
    state.trainers                 # HostMesh of the 2 pods
    job.kill()                     # everything monarch created is deleted

    job = KubernetesJob(namespace="default")
    job.add_mesh("workers", 2)     # no image: adopt pods that already run the agent

The reservation is the one ``monarch serve --scheduler kubernetes`` makes: ``monarch status``
shows it, ``monarch run`` uses it, and ``monarch stop`` releases it.

Differences from Monarch's ``KubernetesJob``, on purpose:

* The meshes of one job share one StatefulSet (or MonarchMesh): pods ``0..a-1`` are the first
  mesh, ``a..a+b-1`` the next, so every mesh must use the same ``ImageSpec``.
* Adopted (pre-provisioned) pods are found by the label ``monarch.pytorch.org/mesh-name=<name>``
  and must hold the job's keys in the Secret ``<name>-keys`` (monarch's agents admit only
  authenticated clients); ``label_selector``/``pod_rank_label`` other than the defaults, and
  ``attach_to``/port-forwarding from outside the cluster, are not supported.
* ``pod_template`` is a ``V1PodTemplateSpec`` or a plain dict; monarch's worker container is
  merged into it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from monarch.errors import UsageError
from monarch.job.job import Job

_DEFAULT_MONARCH_PORT = 26600
_RANK_LABEL = "apps.kubernetes.io/pod-index"


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """The container image of the worker pods, and their resource limits (``{"nvidia.com/gpu": 4}``)."""

    image: str
    resources: dict[str, str | int] | None = None
    enable_fuse: bool = False
    shared_memory_size: str | None = None


@dataclasses.dataclass(frozen=True)
class KubeConfig:
    """Which cluster: ``KubeConfig.from_path(path)``; empty means ``$KUBECONFIG``/``~/.kube/config``."""

    local: Path | None = None
    context: str | None = None

    @classmethod
    def from_path(cls, path: str, context: str | None = None) -> "KubeConfig":
        return cls(local=Path(path).expanduser(), context=context)


class KubernetesJob(Job):
    """Pods in ``namespace``; meshes are added with :meth:`add_mesh` before ``apply``/``state``."""

    def __init__(self, namespace: str, timeout: int | None = None, kubeconfig: KubeConfig | None = None,
                 attach_to: str | None = None) -> None:
        super().__init__()
        if attach_to is not None:
            raise UsageError("KubernetesJob(attach_to=...) is not supported: monarch reaches the pods at their IPs",
                             "run the client where pod IPs route (inside the cluster)")
        self._namespace = namespace
        self._timeout = timeout
        self._kubeconfig = kubeconfig or KubeConfig()
        self._meshes: dict[str, dict[str, Any]] = {}

    def add_mesh(self, name: str, num_replicas: int, label_selector: str | None = None,
                 pod_rank_label: str = _RANK_LABEL, image_spec: ImageSpec | None = None,
                 port: int = _DEFAULT_MONARCH_PORT, pod_template: Any = None,
                 labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> None:
        """Add a mesh of ``num_replicas`` pods: made from ``image_spec``/``pod_template``, else adopted."""
        if not name:
            raise ValueError("Empty mesh name is invalid.")
        if len(name) > 63:
            raise ValueError(f"Mesh name '{name}' is invalid. Name must contain at most 63 characters.")
        if not name.isalnum() or not name.islower():
            raise ValueError(f"Mesh name '{name}' is invalid. Name must contain only lowercase alphanumeric "
                             "characters.")
        if not name[0].isalpha():
            raise ValueError(f"Mesh name '{name}' is invalid. Name must start with an alphabetic character.")
        if image_spec is not None and pod_template is not None:
            raise ValueError("image_spec and pod_template are mutually exclusive.")
        provisioning = image_spec is not None or pod_template is not None
        if provisioning and label_selector is not None:
            raise ValueError("label_selector cannot be set when provisioning.")
        if provisioning and pod_rank_label != _RANK_LABEL:
            raise ValueError("pod_rank_label cannot be customized when provisioning.")
        if not provisioning and (label_selector not in (None, f"monarch.pytorch.org/mesh-name={name}")
                                 or pod_rank_label != _RANK_LABEL):
            raise UsageError("adopting pods by another label selector or rank label is not supported",
                             f"label the pods monarch.pytorch.org/mesh-name={name}")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
        if not provisioning and self._meshes:
            raise UsageError("a KubernetesJob adopts one mesh of pre-provisioned pods", "add one mesh")
        if pod_template is not None and not isinstance(pod_template, dict):
            from kubernetes import client

            pod_template = client.ApiClient().sanitize_for_serialization(pod_template)
        self._meshes[name] = {"num_replicas": int(num_replicas), "image_spec": image_spec, "port": int(port),
                              "pod_template": pod_template, "labels": labels or {}, "annotations": annotations or {}}

    # -- what monarch reserves ------------------------------------------------------------------

    def _job_spec(self):
        from monarch._workbench.state import JobSpec

        if not self._meshes:
            raise UsageError("KubernetesJob has no meshes", "call job.add_mesh(name, num_replicas, ...) first")
        options: dict[str, Any] = {"namespace": self._namespace}
        if self._kubeconfig.local is not None:
            options["kubeconfig"] = str(self._kubeconfig.local)
        if self._kubeconfig.context:
            options["context"] = self._kubeconfig.context
        made = [m for m in self._meshes.values() if m["image_spec"] is not None or m["pod_template"] is not None]
        if not made:
            options["attach"] = next(iter(self._meshes))
        else:
            if len(made) != len(self._meshes):
                raise UsageError("every mesh of a KubernetesJob is either provisioned or adopted, not a mix")
            first = made[0]
            if any((m["image_spec"], m["pod_template"], m["port"]) != (first["image_spec"], first["pod_template"],
                                                                      first["port"]) for m in made):
                raise UsageError("the meshes of one KubernetesJob share one image and pod template",
                                 "use one KubernetesJob per image")
            spec = first["image_spec"]
            if spec is not None:
                options["image"] = spec.image
                for key, value in (spec.resources or {}).items():
                    if key == "nvidia.com/gpu":
                        options["gpus_per_host"] = int(value)
                    elif key in ("cpu", "memory"):
                        options[key] = str(value)
                    else:
                        raise UsageError(f"ImageSpec resource {key!r} is not supported",
                                         "use cpu, memory or nvidia.com/gpu, or a pod_template")
            if first["pod_template"] is not None:
                tmpl = first["pod_template"]
                options["pod_template"] = tmpl
                containers = (tmpl.get("spec") or {}).get("containers") or [{}]
                options.setdefault("image", containers[0].get("image") or "")
                if not options["image"]:
                    raise UsageError("the pod_template's first container has no image")
            if first["port"] != _DEFAULT_MONARCH_PORT:
                options["port"] = first["port"]
        return JobSpec("kubernetes", sum(m["num_replicas"] for m in self._meshes.values()), 1, options)

    def _mesh_sizes(self) -> dict[str, int]:
        return {name: m["num_replicas"] for name, m in self._meshes.items()}

    def _start_timeout(self) -> float | None:
        return float(self._timeout) if self._timeout is not None else None

    def _same_spec(self, spec: Any) -> bool:
        return isinstance(spec, KubernetesJob) and spec._namespace == self._namespace \
            and spec._mesh_sizes() == self._mesh_sizes() and self.record is not None \
            and self.record.spec.scheduler == "kubernetes" and spec._job_spec().compatible(self._job_spec())

    @classmethod
    def _attached(cls, meshes: dict[str, int], record: Any, path: str | None) -> "KubernetesJob":
        """The job object of a reservation ``monarch serve --scheduler kubernetes`` made."""
        o = dict(record.spec.options or {})
        kc = KubeConfig(Path(o["kubeconfig"]) if o.get("kubeconfig") else None, o.get("context"))
        job = cls(o.get("namespace", "default"), kubeconfig=kc)
        for name, n in meshes.items():
            job._meshes[name] = {"num_replicas": n, "image_spec": ImageSpec(o["image"]) if o.get("image") else None,
                                 "port": int(o.get("port", _DEFAULT_MONARCH_PORT)),
                                 "pod_template": o.get("pod_template"), "labels": {}, "annotations": {}}
        Job.__init__(job, record, path)
        return job


__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]
