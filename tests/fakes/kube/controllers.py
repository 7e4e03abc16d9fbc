"""What a real control plane does behind the FAKE API server (see apiserver.py).

One loop, a few passes each tick, each the job of one real component:

- the StatefulSet controller: pods ``<name>-<i>`` with the template's labels plus
  ``apps.kubernetes.io/pod-index``, created in parallel, status ``readyReplicas``;
- the monarch operator (only when the MonarchMesh CRD is "installed"): a MonarchMesh becomes a
  headless Service and a StatefulSet it owns, and gets ``readyReplicas`` and a ``Ready`` condition;
- the garbage collector: an object whose owner (``ownerReferences``) is gone is deleted;
- the scheduler: a pending pod is bound to the node, or stays Pending with ``Unschedulable``
  when the node cannot fit its resource requests (nvidia.com/gpu, cpu, memory).
"""

from __future__ import annotations

import copy
import threading

from tests.fakes.kube.apiserver import _BY_PATH, MONARCH_GROUP, MONARCH_VERSION, ApiError, FakeApiServer

PODS = _BY_PATH[("", "v1", "pods")]
SERVICES = _BY_PATH[("", "v1", "services")]
STATEFULSETS = _BY_PATH[("apps", "v1", "statefulsets")]
MESHES = _BY_PATH[(MONARCH_GROUP, MONARCH_VERSION, "monarchmeshes")]
NODES = _BY_PATH[("", "v1", "nodes")]

#: The one node of the fake cluster: no GPUs, so a GPU request is Unschedulable.
NODE_CAPACITY = {"cpu": 64.0, "memory": 256 * 2**30, "nvidia.com/gpu": 0.0}


def quantity(v) -> float:
    """A Kubernetes quantity ("500m", "64Gi", "8") as a number."""
    s = str(v)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    for u, mult in units.items():
        if s.endswith(u):
            return float(s[: -len(u)]) * mult
    return float(s)


def owner_ref(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


class Controllers:
    def __init__(self, server: FakeApiServer, tick_s: float = 0.05):
        self.server = server
        self.store = server.store
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-controllers", daemon=True)
        self.store.create(NODES, "", {"metadata": {"name": "fake-node-1"},
                                      "status": {"capacity": {k: str(v) for k, v in NODE_CAPACITY.items()},
                                                 "conditions": [{"type": "Ready", "status": "True"}]}})

    def start(self) -> "Controllers":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            for step in (self.operator, self.statefulsets, self.collect_garbage, self.schedule):
                try:
                    step()
                except ApiError:
                    pass  # an object went away between list and update: the next tick sees the new world

    def operator(self) -> None:
        if not self.server.crd_installed:
            return
        for mm in self.store.list(MESHES, ""):
            ns, name = mm["metadata"]["namespace"], mm["metadata"]["name"]
            spec = mm.get("spec", {})
            port = int(spec.get("port", 26600))
            labels = {"app.kubernetes.io/name": "monarch-worker", "monarch.pytorch.org/mesh-name": name}
            if not self.store.list(SERVICES, ns, fields=f"metadata.name={name}"):
                self.store.create(SERVICES, ns, {"metadata": {"name": name, "labels": labels,
                                                              "ownerReferences": [owner_ref(mm)]},
                                                 "spec": {"clusterIP": "None", "selector": labels,
                                                          "ports": [{"name": "monarch", "port": port}]}})
            template = copy.deepcopy(spec.get("podTemplate") or {})
            template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
            sts = self.store.list(STATEFULSETS, ns, fields=f"metadata.name={name}")
            if not sts:
                self.store.create(STATEFULSETS, ns, {
                    "metadata": {"name": name, "labels": labels, "ownerReferences": [owner_ref(mm)]},
                    "spec": {"replicas": int(spec.get("replicas", 1)), "serviceName": name,
                             "podManagementPolicy": "Parallel", "selector": {"matchLabels": labels},
                             "template": template}})
                continue
            ready = sts[0].get("status", {}).get("readyReplicas", 0)
            want = int(spec.get("replicas", 1))

            def status(o: dict, ready=ready, want=want) -> None:
                o["status"] = {"replicas": want, "readyReplicas": ready, "conditions": [
                    {"type": "Ready", "status": "True" if ready >= want else "False",
                     "reason": "AllReplicasReady" if ready >= want else "ReplicasNotReady"}]}
            self.store.update(MESHES, ns, name, status)

    def statefulsets(self) -> None:
        for sts in self.store.list(STATEFULSETS, ""):
            ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
            spec = sts["spec"]
            want = int(spec.get("replicas", 1))
            pods = {p["metadata"]["name"]: p for p in self.store.list(PODS, ns)
                    if any(r.get("uid") == sts["metadata"]["uid"] for r in p["metadata"].get("ownerReferences", []))}
            for i in range(want):
                pod_name = f"{name}-{i}"
                if pod_name in pods:
                    continue
                tmpl = copy.deepcopy(spec.get("template", {}))
                meta = tmpl.get("metadata", {})
                labels = {**meta.get("labels", {}), "apps.kubernetes.io/pod-index": str(i),
                          "statefulset.kubernetes.io/pod-name": pod_name}
                pod_spec = tmpl.get("spec", {})
                pod_spec.setdefault("hostname", pod_name)
                pod_spec.setdefault("subdomain", spec.get("serviceName", name))
                pod_spec.setdefault("restartPolicy", "Always")
                try:
                    self.store.create(PODS, ns, {"metadata": {"name": pod_name, "labels": labels,
                                                              "annotations": meta.get("annotations", {}),
                                                              "ownerReferences": [owner_ref(sts)]},
                                                 "spec": pod_spec})
                except ApiError:
                    pass  # the old pod of that name is still terminating
            for pod_name, p in pods.items():
                if int(pod_name.rsplit("-", 1)[1]) >= want and not p["metadata"].get("deletionTimestamp"):
                    self.store.delete(PODS, ns, pod_name)
            ready = sum(1 for p in pods.values() if _ready(p))

            def status(o: dict, ready=ready, n=len(pods)) -> None:
                o["status"] = {"replicas": n, "readyReplicas": ready, "availableReplicas": ready}
            self.store.update(STATEFULSETS, ns, name, status)

    def collect_garbage(self) -> None:
        uids = self.store.all_uids()
        with self.store.lock:
            orphans = [(k, o) for k, o in self.store.objects.items()
                       if o["metadata"].get("ownerReferences")
                       and not any(r.get("uid") in uids for r in o["metadata"]["ownerReferences"])]
        for (res, ns, name), _ in orphans:
            try:
                self.store.delete(res, ns, name)
            except ApiError:
                pass

    def schedule(self) -> None:
        for pod in self.store.list(PODS, ""):
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            short = _insufficient(pod)
            if short:
                msg = f"0/1 nodes are available: 1 Insufficient {short}."

                def unschedulable(o: dict, msg=msg) -> None:
                    o["status"] = {"phase": "Pending", "conditions": [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}]}
                pod = self.store.update(PODS, ns, name, unschedulable)
                self.store.event(pod, "FailedScheduling", msg, "Warning")
                continue

            def bind(o: dict) -> None:
                o["spec"]["nodeName"] = "fake-node-1"
                o["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
            pod = self.store.update(PODS, ns, name, bind)
            self.store.event(pod, "Scheduled", f"Successfully assigned {ns}/{name} to fake-node-1")


def _insufficient(pod: dict) -> str:
    want: dict[str, float] = {}
    for c in pod["spec"].get("containers", []):
        res = c.get("resources", {})
        for k, v in {**res.get("requests", {}), **res.get("limits", {})}.items():
            want[k] = want.get(k, 0.0) + quantity(v)
    for k, v in want.items():
        if v > NODE_CAPACITY.get(k, 0.0):
            return k
    return ""


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.get("status", {}).get("conditions", []))
