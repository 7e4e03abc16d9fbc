"""The Kubernetes scheduler: one pod per host, reserved once, each running a host agent.

Prerequisites: a cluster the official ``kubernetes`` client reaches (``--kubeconfig``,
``--context``, else ``$KUBECONFIG`` / ``~/.kube/config``) and an image holding Python and monarch
(``--image``).

How this machine reaches the agents (``reach``, ``monarch status`` says which): directly at the
pods' IPs where they answer (a client inside the cluster, or a network that routes pod IPs), else
through a port-forward: a process beside the job's files (``monarch_schedulers.kube_forward``)
carries every connection through ``pods/NAME/portforward`` streams of the API server, and host
rank 0's agent relays the pods' connections back (``monarch_agents.services.relay``).

What it creates (``serve --dry-run -o yaml`` prints it), named ``monarch-<context>-<id>``:

* where the ``MonarchMesh`` custom resource of monarch-kubernetes is installed
  (``monarch.pytorch.org/v1alpha1``, ``monarchmeshes``), one MonarchMesh (spec ``replicas``,
  ``port``, ``podTemplate``) and its operator makes the rest, so one cluster serves PyTorch
  Monarch and monarch alike;
* otherwise what that operator would make: a headless Service and a StatefulSet with
  ``podManagementPolicy: Parallel``;
* a Secret ``NAME-keys`` with what a host agent needs (``JobKeys.for_hosts``: its own pair, the
  proc pair it hands its procs, the members' server pair, the public keys; not the client's
  secret, since user code in a pod can read it), mounted read-only (mode 0400) at
  ``/var/run/secrets/monarch``: never in a pod's arguments or environment;
* a Secret ``NAME-client-keys`` with every key, which no pod mounts (``--attach`` reads it).

Pods carry ``app.kubernetes.io/name=monarch-worker`` and ``monarch.pytorch.org/mesh-name=<name>``;
a pod's host rank is its ``apps.kubernetes.io/pod-index``. The Service and the Secrets are owned by
the top object, so deleting it deletes everything; ``monarch stop`` deletes it (and the Secret)
and waits until the pods are gone.

Agents cannot write to this machine's disk, so their addresses come from the API: each agent
prints its address as its first log line, read through ``pods/<name>/log`` once the pod is
Ready. A pod that restarts, is deleted or is replaced after that is reported by ``describe``
(so ``monarch status``, and a ``monarch run`` whose ranks die with it, say which pod and why).

``--attach NAME`` adopts pods that already run the agent (labelled with mesh-name NAME, keys in
the Secret ``NAME-keys``, the client's in ``NAME-client-keys``); ``monarch stop`` then leaves them running.

Options (``JobSpec.options``): ``image``, ``namespace``, ``kubeconfig``, ``context``,
``gpus_per_host``, ``cpu``, ``memory``, ``node_selector`` (dict), ``tolerations`` (list of
dicts), ``service_account``, ``pod_template`` (a pod spec merged under ours), ``python``,
``port`` (the agent's; the relay listens on the next one), ``use_crd`` (auto|yes|no), ``attach``,
``reach`` (auto|direct|port-forward).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

from monarch_agents.files import write_atomic
from monarch_schedulers.errors import SchedulerError, UsageError
from monarch_schedulers.agent_launch import ROUTE_FILE, agent_file, preload_args, read_route
from monarch_schedulers import kube_http
from monarch_schedulers.base import AllocateRequest, Description, HostState, JobSpec, Scheduler
from monarch_schedulers.processes import OwnedProcess

GROUP, VERSION, PLURAL = "monarch.pytorch.org", "v1alpha1", "monarchmeshes"
NAME_LABEL = "app.kubernetes.io/name"
MESH_LABEL = "monarch.pytorch.org/mesh-name"
INDEX_LABEL = "apps.kubernetes.io/pod-index"
WORKER = "monarch-worker"
KEYS_DIR = "/var/run/secrets/monarch"
DEFAULT_PORT = 26600
_RELEASE_WAIT_S = 60.0
#: Restarts of a pod that never answered after which the reservation is failed, not waited for.
_CRASH_RESTARTS = 3
#: How long a pod's IP gets to answer before this machine is taken to be outside the cluster.
_DIRECT_PROBE_S = 1.0
#: How long the port-forward process gets to start listening.
_FORWARD_START_S = 30.0


def mesh_name(context: str) -> str:
    """A DNS-1123 name for a reservation: ``monarch-<context>-<6 hex>``."""
    base = re.sub(r"[^a-z0-9-]+", "-", context.lower()).strip("-")[:40] or "job"
    return f"monarch-{base}-{uuid.uuid4().hex[:6]}"


class KubernetesScheduler(Scheduler):
    """Hosts are pods; the agents' addresses come from the API."""

    name = "kubernetes"

    def __init__(self, namespace: str = "default", kubeconfig: str | None = None, context: str | None = None):
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.context = context
        self._api = None

    # -- the API -------------------------------------------------------------------------------

    def api(self):
        if self._api is None:
            try:
                from kubernetes import config
            except ImportError:
                raise SchedulerError("the kubernetes scheduler needs the `kubernetes` Python package",
                                     "pip install 'monarch-workbench[kubernetes]'") from None
            try:
                self._api = config.new_client_from_config(config_file=self.kubeconfig, context=self.context)
            except Exception as e:  # ConfigException, a missing file, a bad context: all one line
                where = self.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
                raise SchedulerError(f"cannot load the Kubernetes config {where}: {_first_line(e)}",
                                     "pass --kubeconfig PATH (and --context NAME)") from None
        return self._api

    def _call(self, what: str, fn, *args, **kwargs):
        """One API call; its failure as one line naming what was asked."""
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            raise SchedulerError(f"Kubernetes refused to {what}: {e.status} {_api_message(e)}") from None
        except Exception as e:
            from urllib3.exceptions import HTTPError

            host = getattr(self.api().configuration, "host", "?")
            if isinstance(e, HTTPError):
                raise SchedulerError(f"cannot reach the Kubernetes API at {host} to {what}: {_connection_error(e)}",
                                     "check --kubeconfig/--context, or that the cluster is up") from None
            raise SchedulerError(f"unexpected answer from the Kubernetes API at {host} to {what}: {_first_line(e)}") from None

    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api())

    def apps(self):
        from kubernetes import client

        return client.AppsV1Api(self.api())

    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api())

    def crd_installed(self) -> bool:
        from kubernetes import client

        groups = self._call("list API groups", client.ApisApi(self.api()).get_api_versions)
        return any(g.name == GROUP and any(v.version == VERSION for v in g.versions) for g in groups.groups)

    # -- the manifests -------------------------------------------------------------------------

    def manifests(self, spec: Any, name: str, keys_json: str | None, use_crd: bool) -> list[dict]:
        """Every object ``allocate`` creates, in order (the Secret with the keys, or a placeholder)."""
        o = spec.options
        port = int(o.get("port", DEFAULT_PORT))
        labels = {NAME_LABEL: WORKER, MESH_LABEL: name}
        pods_json = client_json = "<generated by monarch serve>"
        if keys_json is not None:
            from monarch_agents.keys import JobKeys

            # The pods get only what a host agent needs: user code in a pod can read its mounted
            # Secret, so the client's secret is kept out of it.  The full keys go in a second
            # Secret that no pod mounts, which only `serve --attach` reads.
            client_json = keys_json
            pods_json = json.dumps(JobKeys(**json.loads(keys_json)).for_hosts().as_dict())
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": f"{name}-keys", "namespace": self.namespace, "labels": labels},
                  "stringData": {"keys.json": pods_json}}
        client_secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                         "metadata": {"name": f"{name}-client-keys", "namespace": self.namespace, "labels": labels},
                         "stringData": {"keys.json": client_json}}
        template = pod_template(spec, name, port, labels, self.agent_preload)
        if use_crd:
            mesh = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MonarchMesh",
                    "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
                    "spec": {"replicas": spec.hosts, "port": port, "podTemplate": template}}
            return [mesh, secret, client_secret]
        sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
               "spec": {"replicas": spec.hosts, "serviceName": name, "podManagementPolicy": "Parallel",
                        "selector": {"matchLabels": labels}, "template": template}}
        svc = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
               "spec": {"clusterIP": "None", "selector": labels, "ports": [{"name": "monarch", "port": port}]}}
        return [sts, svc, secret, client_secret]

    def dryrun(self, spec: JobSpec, job_dir: str) -> AllocateRequest:
        import yaml

        o = spec.options
        if o.get("attach"):
            text = f"# adopt the pods labelled {MESH_LABEL}={o['attach']} in namespace {self.namespace}\n"
            return AllocateRequest(self.name, job_dir, spec.hosts, text,
                                   payload={"attach": o["attach"], "reach": _reach(o), "port": int(o.get("port", DEFAULT_PORT))})
        if not o.get("image"):
            raise UsageError("the kubernetes scheduler needs an image holding Python and monarch", "add --image IMAGE")
        name = mesh_name(os.path.basename(job_dir.rstrip("/")) or "default")
        use = o.get("use_crd", "auto")
        use_crd = use == "yes" or (use == "auto" and self._crd_or_false())
        try:
            with open(os.path.join(job_dir, "keys.json")) as f:
                keys_json = f.read()
        except OSError:
            keys_json = None  # `serve --dry-run`: nothing generated yet
        objs = self.manifests(spec, name, keys_json, use_crd)
        shown = copy.deepcopy(objs)
        for obj in shown:
            if obj["kind"] == "Secret":
                obj["stringData"] = {"keys.json": "<generated by monarch serve>"}
        text = yaml.safe_dump_all(shown, sort_keys=False)
        return AllocateRequest(self.name, job_dir, spec.hosts, text,
                               payload={"name": name, "objects": objs, "reach": _reach(o),
                                        "port": int(o.get("port", DEFAULT_PORT))})

    def _crd_or_false(self) -> bool:
        try:
            return self.crd_installed()
        except SchedulerError:
            return False  # dry-run without a reachable cluster: show the plain objects

    # -- allocate / describe / release -----------------------------------------------------------

    def allocate(self, request: AllocateRequest) -> str:
        p = request.payload
        if "attach" in p:
            return self._attach(request.job_dir, p["attach"], request.hosts, p.get("reach", "auto"),
                                p.get("port", DEFAULT_PORT))
        name, objs = p["name"], p["objects"]
        top = objs[0]
        ns = self.namespace
        if top["kind"] == "MonarchMesh":
            created = self._call(f"create MonarchMesh {name}", self.custom().create_namespaced_custom_object,
                                 GROUP, VERSION, ns, PLURAL, top)
            uid = created["metadata"]["uid"]
        else:
            created = self._call(f"create StatefulSet {name}", self.apps().create_namespaced_stateful_set, ns, top)
            uid = created.metadata.uid
        owner = {"apiVersion": top["apiVersion"], "kind": top["kind"], "name": name, "uid": uid,
                 "controller": True, "blockOwnerDeletion": True}
        try:
            for obj in objs[1:]:
                obj = copy.deepcopy(obj)
                obj["metadata"]["ownerReferences"] = [owner]
                if obj["kind"] == "Service":
                    self._call(f"create Service {name}", self.core().create_namespaced_service, ns, obj)
                elif obj["kind"] == "Secret":
                    self._call(f"create Secret {obj['metadata']['name']}", self.core().create_namespaced_secret, ns, obj)
        except BaseException:
            self._delete_top(top["kind"], name)
            raise
        job_id = f"{ns}/{name}"
        self._save(request.job_dir, {"job_id": job_id, "kind": top["kind"], "name": name, "adopted": False, "pods": {},
                                     "reach": p.get("reach", "auto"), "port": p.get("port", DEFAULT_PORT)})
        return job_id

    def _attach(self, job_dir: str, name: str, hosts: int, reach: str, port: int) -> str:
        """Adopt running pods: their keys replace the ones ``serve`` made."""
        import base64

        ns = self.namespace
        pods = self._pods(name)
        if not pods:
            raise SchedulerError(f"no pods labelled {MESH_LABEL}={name} in namespace {ns}",
                                 "check the name with `kubectl get pods -l " + f"{MESH_LABEL}={name}`")
        if len(pods) != hosts:
            raise UsageError(f"mesh {name} has {len(pods)} pods, but --hosts {hosts} was asked", f"use --hosts {len(pods)}")
        secret = self._call(f"read Secret {name}-keys", self.core().read_namespaced_secret, f"{name}-keys", ns)
        data = (secret.data or {}).get("keys.json")
        if not data:
            raise SchedulerError(f"Secret {name}-keys has no keys.json", "the pods' Secret must hold the job keys")
        from monarch_agents.keys import JobKeys

        keys = JobKeys(**json.loads(base64.b64decode(data)))
        if not keys.client_secret:
            # Pods made from monarch's manifests hold no client secret: it is in NAME-client-keys,
            # which no pod mounts.
            full = self._call(f"read Secret {name}-client-keys", self.core().read_namespaced_secret,
                              f"{name}-client-keys", ns)
            data = (full.data or {}).get("keys.json")
            if not data:
                raise SchedulerError(f"Secret {name}-client-keys has no keys.json",
                                     "it must hold the job keys the pods' Secret was made from")
            full_keys = JobKeys(**json.loads(base64.b64decode(data)))
            if full_keys.for_hosts() != keys:
                raise SchedulerError(f"Secret {name}-client-keys does not match the pods' Secret {name}-keys",
                                     "make both from the same keys (monarch's manifests do)")
            keys = full_keys
        from monarch_schedulers.agent_launch import write_keys

        write_keys(job_dir, keys)
        self.adopted_keys = keys
        job_id = f"{ns}/{name}"
        self._save(job_dir, {"job_id": job_id, "kind": "attached", "name": name, "adopted": True, "pods": {},
                             "reach": reach, "port": port})
        return job_id

    def _log(self, pod: str, **kw) -> str:
        # Raw bytes: the client would json-decode a log that happens to be one JSON line.
        r = self._call(f"read the log of pod {pod}", self.core().read_namespaced_pod_log, pod, self.namespace,
                       _preload_content=False, **kw)
        return r.data.decode(errors="replace")

    def _pods(self, name: str) -> list:
        pods = self._call("list pods", self.core().list_namespaced_pod, self.namespace,
                          label_selector=f"{MESH_LABEL}={name}").items
        return sorted(pods, key=lambda p: int((p.metadata.labels or {}).get(INDEX_LABEL, "0")))

    def describe(self, job_id: str, job_dir: str | None = None) -> Description | None:
        state = self._load(job_id, job_dir)
        if state is None:
            return None
        try:
            pods, want, gone = self._read_fast(job_dir, state)
        except kube_http.Unavailable:
            pods, want, gone = self._read(state)
            if job_dir and os.path.isdir(job_dir):
                kube_http.Connection.save(job_dir, self.api().configuration)
        if gone:
            return Description(job_id, HostState.ENDED, reason=f"{gone} was deleted", native_state="Deleted")
        nodes = [p.metadata.name for p in pods]
        d = self._describe_pods(job_id, job_dir, state, pods, want, nodes)
        d.details = [_pod_detail(p) for p in pods]
        return d

    def _read(self, state: dict) -> tuple[list, int | None, str]:
        """The pods, how many there should be, and the top object if it was deleted: official client."""
        name = state["name"]
        pods = self._pods(name)
        want = int(state.get("hosts") or 0) or None
        if state["kind"] in ("StatefulSet", "MonarchMesh"):
            from kubernetes.client.exceptions import ApiException

            try:
                if state["kind"] == "StatefulSet":
                    want = self.apps().read_namespaced_stateful_set(name, self.namespace).spec.replicas
                else:
                    mm = self.custom().get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
                    want = int(mm["spec"]["replicas"])
            except ApiException as e:
                if e.status == 404:
                    return pods, want, f"{state['kind']} {name}"
                raise SchedulerError(f"Kubernetes refused to read {state['kind']} {name}: {e.status} {_api_message(e)}") from None
        return pods, want, ""

    def _read_fast(self, job_dir: str | None, state: dict) -> tuple[list, int | None, str]:
        """What :meth:`_read` reads, over plain HTTPS (``kube_http``): no client import on every command."""
        name, ns = state["name"], self.namespace
        reader = kube_http.Reader(kube_http.Connection.load(job_dir))
        try:
            pods = reader.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"{MESH_LABEL}={name}").items or []
            pods.sort(key=lambda p: int((p.metadata.labels or {}).get(INDEX_LABEL, "0")))
            want = int(state.get("hosts") or 0) or None
            try:
                if state["kind"] == "StatefulSet":
                    want = reader.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets/{name}").spec.replicas
                elif state["kind"] == "MonarchMesh":
                    want = int(reader.get(f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/{name}").spec.replicas)
            except kube_http.NotFound:
                return pods, want, f"{state['kind']} {name}"
            return pods, want, ""
        except kube_http.NotFound:
            raise kube_http.Unavailable("pods not listed") from None
        finally:
            reader.close()

    def _describe_pods(self, job_id: str, job_dir: str | None, state: dict, pods: list, want: int | None,
                       nodes: list[str]) -> Description:
        known: dict = state.get("pods", {})
        # A pod we took an address from that is gone, replaced or restarted: the host is lost.
        for _rank, (pod_name, uid, restarts) in known.items():
            now = next((p for p in pods if p.metadata.name == pod_name), None)
            if now is None or now.metadata.uid != uid:
                why = f"pod {pod_name} was deleted" + (" (the StatefulSet made a new one)" if now is not None else "")
                return Description(job_id, HostState.FAILED, reason=why, native_state="PodDeleted", nodes=nodes)
            if now.metadata.deletion_timestamp:
                return Description(job_id, HostState.FAILED, reason=f"pod {pod_name} deleted", native_state="Terminating",
                                   nodes=nodes)
            if _restarts(now) > restarts:
                return Description(job_id, HostState.FAILED, native_state="Restarted", nodes=nodes,
                                   reason=f"pod {pod_name} restarted its agent ({_last_exit(now)})")
        for p in pods:
            # An agent that keeps dying before it ever answered will not start by waiting longer.
            if str((p.metadata.labels or {}).get(INDEX_LABEL)) not in known and _restarts(p) >= _CRASH_RESTARTS:
                tail = " | ".join(self._log(p.metadata.name, tail_lines=3).strip().splitlines()[-3:])
                return Description(job_id, HostState.FAILED, native_state="CrashLoopBackOff", nodes=nodes,
                                   reason=f"pod {p.metadata.name}'s agent keeps exiting ({_last_exit(p)})"
                                          + (f": {tail}" if tail else ""))
        pending = [p for p in pods if not _ready(p)]
        if want is not None and len(pods) < want:
            return Description(job_id, HostState.PENDING, reason=f"pods {len(pods)}/{want} created",
                               native_state="Creating", nodes=nodes)
        if pending:
            p = pending[0]
            reason = _pending_reason(p)
            return Description(job_id, HostState.PENDING, native_state=p.status.phase or "Pending", nodes=nodes,
                               reason=f"pods {len(pods) - len(pending)}/{len(pods)} running ({len(pending)} pending: "
                                      f"{reason})")
        if job_dir and (len(known) < len(pods) or state.get("route") == "port-forward"):
            # The way in first: a client that reads the agents' addresses must be able to use them.
            self._ensure_route(job_dir, state, pods)
            if len(known) < len(pods):
                self._publish_agents(job_id, job_dir, state, pods)
        return Description(job_id, HostState.RUNNING, native_state="Running", nodes=nodes, reason=self._route_text(state))

    # -- how this machine reaches the agents ----------------------------------------------------

    def _route_text(self, state: dict) -> str:
        if state.get("route") == "port-forward":
            return f"agents reached through a port-forward (API server {state.get('api', '?')})"
        if state.get("route") == "direct":
            return "agents reached directly at their pod IPs"
        return "agents not reached yet"

    def _ensure_route(self, job_dir: str, state: dict, pods: list) -> None:
        """Decide once how this machine reaches the pods; keep the port-forward running where needed."""
        port = int(state.get("port", DEFAULT_PORT))
        if state.get("route") is None:
            reach = state.get("reach", "auto")
            if reach == "auto":
                ip = pods[0].status.pod_ip if pods and pods[0].status else None
                reach = "direct" if ip and _answers(ip, port) else "port-forward"
            state["route"] = reach
            state["api"] = self.api().configuration.host
            self._save(job_dir, state)
        if state["route"] != "port-forward":
            return
        fw = state.get("forwarder")
        if fw is not None and OwnedProcess(**fw).alive():
            return
        state["forwarder"] = dataclasses.asdict(self._start_forwarder(job_dir, state["name"], port + 1))
        self._save(job_dir, state)

    def _start_forwarder(self, job_dir: str, name: str, relay_port: int) -> OwnedProcess:
        route_path = os.path.join(job_dir, ROUTE_FILE)
        try:
            os.unlink(route_path)
        except FileNotFoundError:
            pass
        argv = [sys.executable, "-m", "monarch_schedulers.kube_forward", "--job-dir", job_dir, "--mesh", name,
                "--namespace", self.namespace, "--relay-port", str(relay_port)]
        if self.kubeconfig:
            argv += ["--kubeconfig", self.kubeconfig]
        if self.context:
            argv += ["--context", self.context]
        log_path = os.path.join(job_dir, "forward.log")
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        owned = OwnedProcess.of(proc.pid)
        deadline = time.monotonic() + _FORWARD_START_S
        while time.monotonic() < deadline:
            r = read_route(job_dir)
            if r is not None and r.get("pid") == proc.pid:
                return owned
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        owned.signal(9)
        proc.wait()
        try:
            with open(log_path, errors="replace") as f:
                tail = " | ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            tail = ""
        raise SchedulerError("the pods' IPs do not answer from here, and the port-forward to them did not start"
                             + (f": {tail}" if tail else ""), f"see {log_path}")

    def _stop_forwarder(self, job_dir: str | None, state: dict) -> None:
        fw = state.get("forwarder")
        if fw is None:
            return
        proc = OwnedProcess(**fw)
        proc.signal(15)
        deadline = time.monotonic() + 5
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.signal(9)
        if job_dir:
            from monarch_schedulers import kube_forward

            for path in (os.path.join(job_dir, ROUTE_FILE), kube_forward.control_socket_path(job_dir)):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def _publish_agents(self, job_id: str, job_dir: str, state: dict, pods: list) -> None:
        """The agents' addresses, from each Ready pod's first log line, into the files serve waits for."""
        for p in pods:
            rank = int((p.metadata.labels or {}).get(INDEX_LABEL, "-1"))
            if str(rank) in state["pods"] or rank < 0:
                continue
            text = self._log(p.metadata.name, limit_bytes=65536)
            info = _agent_info(text)
            if info is None:
                continue  # Ready before the line is flushed: the next describe reads it
            info["host_rank"] = rank
            info["pod"] = p.metadata.name
            info["published_at"] = time.time()
            _write_json(agent_file(job_dir, rank), info)
            state["pods"][str(rank)] = [p.metadata.name, p.metadata.uid, _restarts(p)]
        self._save(job_dir, state)

    def release(self, job_id: str, job_dir: str | None = None) -> None:
        state = self._load(job_id, job_dir)
        if state is not None:
            self._stop_forwarder(job_dir, state)
        if state is None or state.get("adopted"):
            return  # nothing of ours, or pods someone else provisioned: leave them running
        name = state["name"]
        self._delete_top(state["kind"], name)
        from kubernetes.client.exceptions import ApiException

        for secret in (f"{name}-keys", f"{name}-client-keys"):
            try:
                self.core().delete_namespaced_secret(secret, self.namespace)
            except ApiException as e:
                if e.status != 404:
                    raise SchedulerError(f"Kubernetes refused to delete Secret {secret}: {e.status} {_api_message(e)}") from None
        deadline = time.monotonic() + _RELEASE_WAIT_S
        while self._pods(name):
            if time.monotonic() > deadline:
                raise SchedulerError(f"pods of {name} still terminating after {_RELEASE_WAIT_S:.0f} s",
                                     f"kubectl get pods -l {MESH_LABEL}={name}")
            time.sleep(0.2)

    def _delete_top(self, kind: str, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        body = client.V1DeleteOptions(propagation_policy="Foreground")
        try:
            if kind == "MonarchMesh":
                self.custom().delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, body=body)
            else:
                self.apps().delete_namespaced_stateful_set(name, self.namespace, body=body)
        except ApiException as e:
            if e.status != 404:
                raise SchedulerError(f"Kubernetes refused to delete {kind} {name}: {e.status} {_api_message(e)}") from None

    def logs(self, job_id: str, host: int | None = None, job_dir: str | None = None) -> str:
        state = self._load(job_id, job_dir)
        if state is None:
            return ""
        out = []
        for p in self._pods(state["name"]):
            rank = int((p.metadata.labels or {}).get(INDEX_LABEL, "-1"))
            if host is not None and rank != host:
                continue
            try:
                text = self._log(p.metadata.name, tail_lines=200)
            except SchedulerError as e:
                text = f"(no log: {e.message})"
            out.append(f"== {p.metadata.name} ==\n{text}")
        return "\n".join(out)

    # -- the job's own record ----------------------------------------------------------------------

    def _save(self, job_dir: str, state: dict) -> None:
        _write_json(os.path.join(job_dir, "kubernetes.json"), state)

    def _load(self, job_id: str, job_dir: str | None) -> dict | None:
        if job_dir:
            try:
                with open(os.path.join(job_dir, "kubernetes.json")) as f:
                    state = json.load(f)
                if state.get("job_id") == job_id:
                    return state
            except (OSError, ValueError):
                pass
        ns, _, name = job_id.partition("/")
        return {"job_id": job_id, "kind": "StatefulSet", "name": name, "adopted": False, "pods": {}} if name else None


def pod_template(spec: Any, name: str, port: int, labels: dict, preload: tuple[str, ...] = ()) -> dict:
    """The pod every host runs: the agent, its keys mounted from the Secret, the user's settings."""
    o = spec.options
    py = o.get("python", "python3")
    resources: dict = {}
    limits = {k: str(v) for k, v in (("cpu", o.get("cpu")), ("memory", o.get("memory")),
                                      ("nvidia.com/gpu", o.get("gpus_per_host"))) if v}
    if limits:
        resources = {"limits": limits, "requests": dict(limits)}
    env = [{"name": "MONARCH_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "MONARCH_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "MONARCH_POD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX_LABEL}']"}}}]
    container = {
        "name": "worker", "image": o["image"],
        "command": [py, "-m", "monarch_agents.host_agent", "--keys-file", f"{KEYS_DIR}/keys.json",
                    "--host-rank", "$(MONARCH_POD_INDEX)", "--hostname", "$(MONARCH_POD_NAME)",
                    "--bind", "$(MONARCH_POD_IP)", "--port", str(port), "--relay-port", str(port + 1),
                    "--log-dir", "monarch-logs", *preload_args(preload)],
        "env": env,
        "ports": [{"name": "monarch", "containerPort": port}, {"name": "monarch-relay", "containerPort": port + 1}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
        "volumeMounts": [{"name": "monarch-keys", "mountPath": KEYS_DIR, "readOnly": True}],
    }
    if resources:
        container["resources"] = resources
    pod_spec: dict = {"containers": [container], "terminationGracePeriodSeconds": 10,
                      "volumes": [{"name": "monarch-keys", "secret": {"secretName": f"{name}-keys", "defaultMode": 0o400}}]}
    if o.get("node_selector"):
        pod_spec["nodeSelector"] = dict(o["node_selector"])
    if o.get("tolerations"):
        pod_spec["tolerations"] = list(o["tolerations"])
    if o.get("service_account"):
        pod_spec["serviceAccountName"] = o["service_account"]
    template = {"metadata": {"labels": dict(labels)}, "spec": pod_spec}
    user = o.get("pod_template")
    if user:
        template = _merge_template(copy.deepcopy(user), template)
    return template


def _merge_template(user: dict, ours: dict) -> dict:
    """The user's pod template with our worker container, volume and labels merged in."""
    if user.get("kind") == "Pod":
        user = {"metadata": user.get("metadata", {}), "spec": user.get("spec", {})}
    spec = user.setdefault("spec", {})
    mine = ours["spec"]["containers"][0]
    containers = spec.setdefault("containers", [])
    worker = next((c for c in containers if c.get("name") == "worker"), None)
    if worker is None:
        containers.insert(0, mine)
    else:
        for k, v in mine.items():
            if k in ("env", "volumeMounts", "ports"):
                worker[k] = [*worker.get(k, []), *v]
            elif k == "image" and worker.get("image"):
                continue
            else:
                worker[k] = v
    spec["volumes"] = [*spec.get("volumes", []), *ours["spec"]["volumes"]]
    for k, v in ours["spec"].items():
        if k not in ("containers", "volumes"):
            spec.setdefault(k, v)
    user.setdefault("metadata", {}).setdefault("labels", {}).update(ours["metadata"]["labels"])
    return user


def _reach(options: dict) -> str:
    reach = options.get("reach") or "auto"
    if reach not in ("auto", "direct", "port-forward"):
        raise UsageError(f"reach {reach!r} is not auto, direct or port-forward", "e.g. --reach port-forward")
    return reach


def _answers(ip: str, port: int) -> bool:
    """Whether a TCP connection to ``ip:port`` opens from here (the pod network is routed to us)."""
    try:
        with socket.create_connection((ip, port), timeout=_DIRECT_PROBE_S):
            return True
    except OSError:
        return False


def _agent_info(log_text: str) -> dict | None:
    for line in log_text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"addr"' in line:
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _pod_detail(pod) -> dict:
    """One pod as ``monarch status`` shows it."""
    return {"pod": pod.metadata.name, "rank": int((pod.metadata.labels or {}).get(INDEX_LABEL, "-1")),
            "phase": "Terminating" if pod.metadata.deletion_timestamp else (pod.status.phase or "Pending"),
            "ready": _ready(pod), "restarts": _restarts(pod), "node": pod.spec.node_name or "",
            "ip": pod.status.pod_ip or "", "reason": "" if _ready(pod) else _pending_reason(pod)}


def _ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _restarts(pod) -> int:
    return sum(c.restart_count or 0 for c in (pod.status.container_statuses or []))


def _last_exit(pod) -> str:
    for c in pod.status.container_statuses or []:
        t = c.last_state and c.last_state.terminated
        if t:
            return f"exit code {t.exit_code}{', ' + t.reason if t.reason else ''}"
    return "the container restarted"


def _pending_reason(pod) -> str:
    for c in pod.status.container_statuses or []:
        w = c.state and c.state.waiting
        if w and w.reason:
            return f"{w.reason}: {w.message}" if w.message else w.reason
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"{cond.reason}: {cond.message}" if cond.message else (cond.reason or "unschedulable")
    if pod.status.phase == "Running":
        return "agent starting (not Ready yet)"
    return pod.status.phase or "Pending"


def _api_message(e) -> str:
    try:
        return json.loads(e.body).get("message") or e.reason
    except (TypeError, ValueError):
        return e.reason or ""


def _connection_error(e: BaseException) -> str:
    """urllib3's failure as a person says it ("Connection refused", a TLS or name error), not its
    retry pool's repr: the OS's words where there are some, else its message without object reprs."""
    first = getattr(e, "reason", None) or e  # MaxRetryError carries the last attempt's error
    x: BaseException | None = first
    while x is not None:
        if isinstance(x, OSError) and x.strerror:
            return x.strerror
        x = x.__cause__ or x.__context__
    return re.sub(r"<[^<>]* object at 0x[0-9a-f]+>:?\s*", "", _first_line(first)) or type(first).__name__


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _write_json(path: str, data: dict) -> None:
    write_atomic(path, json.dumps(data).encode())


def create_scheduler(**opts) -> KubernetesScheduler:
    return KubernetesScheduler(**opts)
