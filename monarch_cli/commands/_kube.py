"""``monarch serve --scheduler kubernetes`` flags into the scheduler's options."""

from __future__ import annotations

import os

from monarch.errors import UsageError


def kube_options(flags: dict, node_selector: tuple[str, ...], tolerations: tuple[str, ...],
                 pod_template: str | None) -> dict:
    """The JobSpec options: plain flags, ``K=V`` selectors, ``KEY[=VALUE]:EFFECT`` tolerations, the template file."""
    out = {k: v for k, v in flags.items() if v is not None}
    if out.get("kubeconfig"):
        out["kubeconfig"] = os.path.abspath(out["kubeconfig"])
    if node_selector:
        sel = {}
        for item in node_selector:
            k, eq, v = item.partition("=")
            if not eq or not k:
                raise UsageError(f"--node-selector {item!r} is not KEY=VALUE", "e.g. --node-selector gpu=a100")
            sel[k] = v
        out["node_selector"] = sel
    if tolerations:
        out["tolerations"] = [_toleration(t) for t in tolerations]
    if pod_template:
        import yaml

        try:
            with open(pod_template) as f:
                tmpl = yaml.safe_load(f)
        except (OSError, yaml.YAMLError) as e:
            raise UsageError(f"cannot read the pod template {pod_template}: {str(e).splitlines()[0]}") from None
        if not isinstance(tmpl, dict) or not isinstance(tmpl.get("spec", {}), dict):
            raise UsageError(f"the pod template {pod_template} is not a Pod or pod template mapping")
        out["pod_template"] = tmpl
    return out


def _toleration(text: str) -> dict:
    key_value, colon, effect = text.rpartition(":")
    if not colon or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise UsageError(f"--toleration {text!r} is not KEY[=VALUE]:EFFECT",
                         "e.g. --toleration nvidia.com/gpu:NoSchedule")
    key, eq, value = key_value.partition("=")
    if eq:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}
