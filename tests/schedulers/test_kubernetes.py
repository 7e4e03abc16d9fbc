"""The Kubernetes scheduler against the FAKE API server of tests/fakes/kube (real REST, real client,
real kubectl; pods are local host-agent processes started by the fake kubelet)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes.kube.cluster import FakeCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
IMAGE = "monarch:test"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fake kubelet bind-mounts Secrets (root only)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"]}
    c = FakeCluster(str(tmp_path_factory.mktemp("kube")), [IMAGE], env=env).start()
    yield c
    c.stop()


def monarch(*args: str, cwd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run([os.path.join(BIN, "monarch"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"monarch {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def kubectl(cluster: FakeCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([os.path.join(BIN, "kubectl"), "--kubeconfig", cluster.kubeconfig, *args],
                       capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def serve_args(cluster: FakeCluster, hosts: int = 2, *extra: str) -> list[str]:
    return ["serve", "--scheduler", "kubernetes", "--hosts", str(hosts), "--image", IMAGE,
            "--kubeconfig", cluster.kubeconfig, "--timeout", "60", *extra]


def test_serve_run_twice_status_stop(cluster, tmp_path):
    r = monarch("--json", *serve_args(cluster), cwd=str(tmp_path))
    data = json.loads(r.stdout)
    assert data["ready"] and len(data["hosts"]) == 2
    name = data["job_id"].split("/")[1]
    pods = json.loads(kubectl(cluster, "get", "pods", "-l", f"monarch.pytorch.org/mesh-name={name}", "-o", "json").stdout)
    assert sorted(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"] for p in pods["items"]) == ["0", "1"]
    for p in pods["items"]:
        assert p["metadata"]["labels"]["app.kubernetes.io/name"] == "monarch-worker"
        c = p["spec"]["containers"][0]
        # the keys never travel in arguments or environment, only in the mounted Secret
        text = json.dumps(c)
        assert "secret" not in text.lower().replace("secrets/monarch", "")
        assert p["spec"]["volumes"][0]["secret"]["defaultMode"] == 0o400
    first = monarch("run", "--", "sh", "-c", "echo rank=$NODE_RANK host=$(hostname)", cwd=str(tmp_path))
    out = first.stdout + first.stderr
    assert f"rank=0 host={name}-0" in out and f"rank=1 host={name}-1" in out, out  # each pod its own hostname
    # What user code in a pod can read (the mounted Secret) holds no client secret: a rank cannot act
    # as the client (run commands on other pods, stop them); the host agents still answer (run above).
    seen = monarch("run", "--", "cat", "/var/run/secrets/monarch/keys.json", cwd=str(tmp_path)).stdout
    full = json.loads(next(tmp_path.joinpath(".monarch").rglob("keys.json")).read_text())
    assert full["client_secret"] and full["client_secret"] not in seen, seen
    assert full["host_secret"] in seen and full["proc_secret"] in seen, seen  # what a host agent needs
    assert seen.count('"client_secret": ""') == 2, seen  # both pods
    stored = json.loads(kubectl(cluster, "get", "secret", f"{name}-keys", "-o", "json").stdout)
    import base64

    assert json.loads(base64.b64decode(stored["data"]["keys.json"]))["client_secret"] == ""
    mounted = {v["secret"]["secretName"] for p in pods["items"] for v in p["spec"]["volumes"] if "secret" in v}
    assert mounted == {f"{name}-keys"}  # the full keys' Secret (for --attach) is in no pod
    pids = set(cluster.kubelet.pids())
    monarch("run", "--", "true", cwd=str(tmp_path))
    assert set(cluster.kubelet.pids()) == pids  # same pods, no new ones
    st = json.loads(monarch("--json", "status", cwd=str(tmp_path)).stdout)
    assert st["state"] == "RUNNING", st
    # Later commands read the API without importing the official client (0.6 s of CPU each)...
    conn_file = next(tmp_path.joinpath(".monarch").rglob("kube-connection.json"))
    assert oct(conn_file.stat().st_mode & 0o777) == "0o600"
    imports = subprocess.run([sys.executable, "-X", "importtime", "-m", "monarch_cli.main", "status"], cwd=str(tmp_path),
                             capture_output=True, text=True, timeout=60)
    assert imports.returncode == 0 and "kubernetes.client" not in imports.stderr, imports.stderr[-2000:]
    # ...and where that read cannot be used (an expired token), ask through the client, which saves a fresh one.
    conn = json.loads(conn_file.read_text())
    conn_file.write_text(json.dumps({**conn, "token": "Bearer expired"}))
    assert json.loads(monarch("--json", "status", cwd=str(tmp_path)).stdout)["state"] == "RUNNING"
    assert json.loads(conn_file.read_text())["token"] == conn["token"]
    assert [(h["pod"], h["phase"], h["ready"], h["restarts"], h["node"]) for h in st["scheduler_hosts"]] == [
        (f"{name}-0", "Running", True, 0, "fake-node-1"), (f"{name}-1", "Running", True, 0, "fake-node-1")]
    describe = kubectl(cluster, "describe", "statefulset", name).stdout
    assert name in describe
    monarch("stop", cwd=str(tmp_path))
    left = kubectl(cluster, "get", "pods,secrets,services,statefulsets", "-l",
                   f"monarch.pytorch.org/mesh-name={name}", "-o", "name").stdout.strip()
    assert left == ""
    assert not cluster.kubelet.running


def test_dry_run_yaml_is_what_kubectl_accepts(cluster, tmp_path):
    r = monarch(*serve_args(cluster, 3, "--gpus-per-host", "1", "--node-selector", "pool=gpu",
                            "--toleration", "nvidia.com/gpu:NoSchedule"), "--dry-run", "-o", "yaml", cwd=str(tmp_path))
    manifest = tmp_path / "mesh.yaml"
    manifest.write_text(r.stdout)
    import yaml

    docs = list(yaml.safe_load_all(r.stdout))
    assert [d["kind"] for d in docs] == ["StatefulSet", "Service", "Secret", "Secret"]
    for d in docs[2:]:
        assert "generated by monarch serve" in d["stringData"]["keys.json"]  # no key material printed
    tmpl = docs[0]["spec"]["template"]["spec"]
    assert tmpl["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    command = tmpl["containers"][0]["command"]  # the API the procs run, named by the monarch layer
    assert command[command.index("--preload") + 1] == "monarch.actor"
    assert tmpl["nodeSelector"] == {"pool": "gpu"}
    assert tmpl["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # Every object is a valid one of its kind for the official client's models...
    from kubernetes import client

    api = client.ApiClient()
    for d, model in zip(docs, ("V1StatefulSet", "V1Service", "V1Secret")):
        class Resp:
            data = json.dumps(d)
        assert api.deserialize(Resp, model).metadata.name
    # ...and the server takes them (the fake serves no OpenAPI, so kubectl's client-side schema check is off).
    out = kubectl(cluster, "create", "--dry-run=server", "--validate=false", "-f", str(manifest)).stdout
    assert "created (server dry run)" in out
    assert kubectl(cluster, "get", "statefulsets", "-o", "name").stdout.strip() == ""  # dry run made nothing
    assert not (tmp_path / ".monarch" / "job_state.pkl").exists()


def test_pending_pod_reports_its_reason_and_times_out(cluster, tmp_path):
    r = monarch(*serve_args(cluster, 1, "--gpus-per-host", "8"), "--timeout", "3", cwd=str(tmp_path), check=False)
    assert r.returncode == 4, r.stderr
    assert "hosts not ready" in r.stderr
    st = monarch("--json", "status", cwd=str(tmp_path), check=False)
    # serve gave the pods back when it gave up: nothing is left pending
    assert kubectl(cluster, "get", "pods", "-o", "name").stdout.strip() == ""
    assert st.returncode != 0


def test_pending_reason_in_status(cluster, tmp_path):
    monarch(*serve_args(cluster, 1, "--gpus-per-host", "8"), "--no-wait", cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 30
        while True:
            st = json.loads(monarch("--json", "status", cwd=str(tmp_path), check=False).stdout or "{}")
            if "Unschedulable" in json.dumps(st) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert "Insufficient nvidia.com/gpu" in json.dumps(st), st
        assert "FailedScheduling" in kubectl(cluster, "describe", "pods").stdout
    finally:
        monarch("stop", cwd=str(tmp_path))


def test_unknown_image_is_reported(cluster, tmp_path):
    monarch("serve", "--scheduler", "kubernetes", "--hosts", "1", "--image", "nope:missing",
                "--kubeconfig", cluster.kubeconfig, "--no-wait", cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 30
        text = ""
        while "ImagePull" not in text and time.monotonic() < deadline:
            st = monarch("status", cwd=str(tmp_path), check=False)
            text = st.stdout + st.stderr
            time.sleep(0.3)
        assert "ErrImagePull" in text or "ImagePullBackOff" in text, text
    finally:
        monarch("stop", cwd=str(tmp_path))


def test_pod_deleted_during_run_fails_the_run_naming_the_pod(cluster, tmp_path):
    monarch(*serve_args(cluster, 2), cwd=str(tmp_path))
    try:
        run = subprocess.Popen([os.path.join(BIN, "monarch"), "run", "--", "sleep", "60"], cwd=str(tmp_path),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        name = json.loads(monarch("--json", "status", cwd=str(tmp_path)).stdout)["job_id"].split("/")[1]
        kubectl(cluster, "delete", "pod", f"{name}-1", "--wait=false")
        out, err = run.communicate(timeout=60)
        assert run.returncode != 0
        assert f"pod {name}-1" in err and "deleted" in err, err
        st = monarch("status", cwd=str(tmp_path), check=False)
        assert f"pod {name}-1" in st.stdout + st.stderr
        # On request, serve replaces the broken reservation: new pods, and runs work again.
        again = json.loads(monarch("--json", *serve_args(cluster, 2), "--replace", cwd=str(tmp_path)).stdout)
        assert again["ready"] and again["job_id"].split("/")[1] != name
        assert kubectl(cluster, "get", "statefulset", name, check=False).returncode != 0  # the old one is gone
        monarch("run", "--", "true", cwd=str(tmp_path))
        # The StatefulSet deleted outside monarch: status says so (read without the official client).
        new = again["job_id"].split("/")[1]
        kubectl(cluster, "delete", "statefulset", new, "--wait=false")
        st = monarch("--json", "status", cwd=str(tmp_path), check=False)
        assert f"StatefulSet {new} was deleted" in st.stdout + st.stderr, st.stdout + st.stderr
    finally:
        monarch("stop", cwd=str(tmp_path), check=False)
    assert not cluster.kubelet.running


def test_attach_to_pre_provisioned_pods(cluster, tmp_path):
    """Pods someone else made (kubectl apply of monarch's manifests, keys included) are adopted, then left running."""
    import yaml

    from monarch_agents.keys import JobKeys
    from monarch._workbench.state import JobSpec
    from monarch_schedulers.kubernetes import KubernetesScheduler

    keys = JobKeys.generate()
    sched = KubernetesScheduler(kubeconfig=cluster.kubeconfig)
    objs = sched.manifests(JobSpec("kubernetes", 2, 1, {"image": IMAGE}), "shared-mesh", json.dumps(keys.as_dict()),
                           use_crd=False)
    (tmp_path / "mesh.yaml").write_text(yaml.safe_dump_all(objs))
    kubectl(cluster, "apply", "--validate=false", "-f", str(tmp_path / "mesh.yaml"))
    try:
        work = tmp_path / "work"
        work.mkdir()
        r = monarch("serve", "--scheduler", "kubernetes", "--hosts", "2", "--attach", "shared-mesh",
                    "--kubeconfig", cluster.kubeconfig, "--timeout", "60", cwd=str(work))
        assert "ready" in r.stderr
        out = monarch("run", "--", "hostname", cwd=str(work))
        assert "shared-mesh-0" in out.stdout and "shared-mesh-1" in out.stdout
        monarch("stop", cwd=str(work))
        pods = kubectl(cluster, "get", "pods", "-l", "monarch.pytorch.org/mesh-name=shared-mesh", "-o", "name").stdout.split()
        assert len(pods) == 2  # not ours to delete
        bad = monarch("serve", "--scheduler", "kubernetes", "--hosts", "3", "--attach", "shared-mesh",
                      "--kubeconfig", cluster.kubeconfig, cwd=str(work), check=False)
        assert bad.returncode == 2 and "has 2 pods" in bad.stderr
    finally:
        kubectl(cluster, "delete", "-f", str(tmp_path / "mesh.yaml"))
    deadline = time.monotonic() + 30
    while cluster.kubelet.running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not cluster.kubelet.running


def _left_in(work: Path) -> list[str]:
    """What a command left in ``work`` (a failed first serve: not even an empty ``.monarch/``)."""
    return sorted(str(p.relative_to(work)) for p in work.rglob("*"))


@pytest.mark.parametrize("deleted", ["keys", "client-keys"])
def test_attach_to_pods_whose_keys_secret_is_missing(cluster, tmp_path, deleted):
    """The pods run, but their Secret (a host agent's keys), or the one with the client's (which no pod
    mounts), was deleted: one line naming it, nothing reserved, pods left alone."""
    import yaml

    from monarch_agents.keys import JobKeys
    from monarch._workbench.state import JobSpec
    from monarch_schedulers.kubernetes import KubernetesScheduler

    sched = KubernetesScheduler(kubeconfig=cluster.kubeconfig)
    objs = sched.manifests(JobSpec("kubernetes", 1, 1, {"image": IMAGE}), "keyless-mesh",
                           json.dumps(JobKeys.generate().as_dict()), use_crd=False)
    (tmp_path / "mesh.yaml").write_text(yaml.safe_dump_all(objs))
    kubectl(cluster, "apply", "--validate=false", "-f", str(tmp_path / "mesh.yaml"))
    try:
        kubectl(cluster, "delete", "secret", f"keyless-mesh-{deleted}")
        work = tmp_path / "work"
        work.mkdir()
        r = monarch("serve", "--scheduler", "kubernetes", "--hosts", "1", "--attach", "keyless-mesh",
                    "--kubeconfig", cluster.kubeconfig, "--timeout", "60", cwd=str(work), check=False)
        assert r.returncode == 4, r.stderr  # ExitCode.SCHEDULER
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
        assert f"keyless-mesh-{deleted}" in r.stderr.splitlines()[0], r.stderr
        assert _left_in(work) == []
        pods = kubectl(cluster, "get", "pods", "-l", "monarch.pytorch.org/mesh-name=keyless-mesh", "-o", "name").stdout
        assert len(pods.split()) == 1  # not ours: left as they were
    finally:
        kubectl(cluster, "delete", "--ignore-not-found", "-f", str(tmp_path / "mesh.yaml"))


def test_attach_with_an_unreachable_api_server(tmp_path):
    """A kubeconfig whose server does not answer (nothing listens on port 1): one line, nothing left."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "down",
        "clusters": [{"name": "down", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "down", "context": {"cluster": "down", "user": "u"}}]}))
    r = monarch("serve", "--scheduler", "kubernetes", "--hosts", "2", "--attach", "some-mesh",
                "--kubeconfig", str(kubeconfig), "--timeout", "60", cwd=str(tmp_path), check=False, timeout=60)
    assert r.returncode == 4, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    first = r.stderr.splitlines()[0]
    assert "https://127.0.0.1:1" in first and first.endswith("Connection refused"), r.stderr  # not urllib3's pool
    assert _left_in(tmp_path) == ["kubeconfig"]


def test_bad_input(cluster, tmp_path):
    r = monarch("serve", "--scheduler", "kubernetes", "--hosts", "1", "--kubeconfig", cluster.kubeconfig,
                cwd=str(tmp_path), check=False)
    assert r.returncode == 2 and "--image" in r.stderr
    r = monarch("serve", "--scheduler", "kubernetes", "--hosts", "1", "--image", IMAGE,
                "--kubeconfig", str(tmp_path / "missing"), cwd=str(tmp_path), check=False)
    assert r.returncode == 4 and "cannot load the Kubernetes config" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2
    r = monarch("serve", "--hosts", "1", "--image", IMAGE, cwd=str(tmp_path), check=False)
    assert r.returncode == 2 and "--scheduler kubernetes" in r.stderr
    r = monarch("serve", "--scheduler", "kubernetes", "--hosts", "1", "--image", IMAGE, "--toleration", "bad",
                "--kubeconfig", cluster.kubeconfig, cwd=str(tmp_path), check=False)
    assert r.returncode == 2 and "KEY[=VALUE]:EFFECT" in r.stderr
    assert not (tmp_path / ".monarch" / "job_state.pkl").exists()


def test_monarch_mesh_custom_resource_when_installed(tmp_path_factory, tmp_path):
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"]}
    c = FakeCluster(str(tmp_path_factory.mktemp("kube-crd")), [IMAGE], crd_installed=True, env=env).start()
    try:
        data = json.loads(monarch("--json", *serve_args(c, 2), cwd=str(tmp_path)).stdout)
        name = data["job_id"].split("/")[1]
        mm = json.loads(kubectl(c, "get", "monarchmeshes", name, "-o", "json").stdout)
        assert mm["spec"]["replicas"] == 2 and mm["status"]["readyReplicas"] == 2
        assert any(x["type"] == "Ready" and x["status"] == "True" for x in mm["status"]["conditions"])
        out = monarch("run", "--", "hostname", cwd=str(tmp_path)).stdout
        assert f"{name}-0" in out and f"{name}-1" in out
        monarch("stop", cwd=str(tmp_path))
        assert kubectl(c, "get", "pods,secrets,services,statefulsets", "-o", "name").stdout.strip() == ""
    finally:
        c.stop()


KUBERNETES_JOB_PROGRAM = '''
import sys
from monarch.actor import Actor, endpoint
from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

class Where(Actor):
    @endpoint
    def host(self) -> str:
        import socket
        return socket.gethostname()

job = KubernetesJob(namespace="default", kubeconfig=KubeConfig.from_path(sys.argv[1]))
job.add_mesh("trainers", 2, image_spec=ImageSpec("monarch:test"))
job.add_mesh("evals", 1, image_spec=ImageSpec("monarch:test"))
state = job.state()
print("trainers", sorted(state.trainers.spawn_procs(per_host={"procs": 1}).spawn("w", Where).host.call().get().values()))
print("evals", sorted(state.evals.spawn_procs(per_host={"procs": 1}).spawn("w", Where).host.call().get().values()))
'''


def test_kubernetes_job_from_python_is_the_serve_reservation(cluster, tmp_path):
    """Monarch's KubernetesJob: two meshes on pods made once; `monarch status` sees it, job.kill() removes it."""
    (tmp_path / "prog.py").write_text(KUBERNETES_JOB_PROGRAM)
    r = subprocess.run([sys.executable, "prog.py", cluster.kubeconfig], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert lines["trainers"].count("monarch-default-") == 2 and lines["evals"].count("monarch-default-") == 1
    st = json.loads(monarch("--json", "status", cwd=str(tmp_path)).stdout)
    assert st["scheduler"] == "kubernetes" and st["state"] == "RUNNING" and len(st["hosts"]) == 3
    # A second program with the same job reuses the pods (no new StatefulSet).
    pods = sorted(kubectl(cluster, "get", "pods", "-o", "name").stdout.split())
    r = subprocess.run([sys.executable, "prog.py", cluster.kubeconfig], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert sorted(kubectl(cluster, "get", "pods", "-o", "name").stdout.split()) == pods
    kill = subprocess.run([sys.executable, "-c", "from monarch.job import job_load; job_load().kill()"],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert kill.returncode == 0, kill.stderr
    assert kubectl(cluster, "get", "pods,secrets,statefulsets", "-o", "name").stdout.strip() == ""


def test_kubernetes_job_names_as_monarch():
    from monarch.job.kubernetes import ImageSpec, KubernetesJob

    job = KubernetesJob(namespace="default")
    for bad, why in (("", "Empty mesh name"), ("Trainers", "lowercase"), ("1abc", "start with an alphabetic"),
                     ("a-b", "lowercase alphanumeric")):
        with pytest.raises(ValueError, match=why):
            job.add_mesh(bad, 1)
    with pytest.raises(ValueError, match="mutually exclusive"):
        job.add_mesh("a", 1, image_spec=ImageSpec("x"), pod_template={"spec": {}})
    with pytest.raises(ValueError, match="label_selector cannot be set when provisioning"):
        job.add_mesh("a", 1, image_spec=ImageSpec("x"), label_selector="a=b")


def test_agent_that_cannot_start_fails_serve_with_its_last_words(cluster, tmp_path):
    tmpl = tmp_path / "pod.yaml"
    # args are appended to monarch's command: the agent refuses them and exits 2, again and again
    tmpl.write_text("spec:\n  containers:\n  - name: worker\n    args: [--no-such-flag]\n")
    r = monarch(*serve_args(cluster, 1, "--pod-template", str(tmpl)), cwd=str(tmp_path), check=False)
    assert r.returncode == 4, r.stderr
    assert "keeps exiting" in r.stderr and "exit code 2" in r.stderr and "unrecognized arguments" in r.stderr, r.stderr
    assert kubectl(cluster, "get", "pods", "-o", "name").stdout.strip() == ""  # serve gave them back


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A laptop outside the cluster: its own network stack, from which the API server answers (on a
    bridge) and the pods' IPs do not (they are loopback addresses of the cluster's machine)."""
    from monarch_schedulers import netns

    why = netns.unavailable()
    if why:
        pytest.skip(why)
    plan = netns.create(f"kpf{os.getpid() % 100000}", 1)
    try:
        env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"]}
        c = FakeCluster(str(tmp_path_factory.mktemp("kube-outside")), [IMAGE], env=env, host=plan.bridge_ip).start()
        try:
            yield plan.hosts[0], c
        finally:
            c.stop()
    finally:
        netns.remove(plan)


def test_client_outside_the_cluster_reaches_the_pods_through_a_port_forward(outside, tmp_path):
    from monarch_schedulers import netns

    laptop, cluster = outside
    # A deep project folder: the job folder's path is too long for a Unix socket's.
    tmp_path = tmp_path / ("deep-project-folder-" * 4)
    tmp_path.mkdir()

    def on_laptop(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(netns.enter_argv(laptop, [os.path.join(BIN, "monarch"), *args]), cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"monarch {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    data = json.loads(on_laptop("--json", *serve_args(cluster)).stdout)
    assert data["ready"], data
    name = data["job_id"].split("/")[1]
    pod_ips = [p["status"]["podIP"] for p in json.loads(kubectl(cluster, "get", "pods", "-o", "json").stdout)["items"]]
    # The laptop really cannot reach a pod: the forward is needed, not a detour.
    probe = subprocess.run(netns.enter_argv(laptop, [sys.executable, "-c",
                           f"import socket; socket.create_connection(('{pod_ips[0]}', 26600), timeout=2)"]),
                           capture_output=True, text=True, timeout=30)
    assert probe.returncode != 0
    st = json.loads(on_laptop("--json", "status").stdout)
    assert st["state"] == "RUNNING" and f"port-forward (API server {cluster.server.url})" in st["reason"], st
    # Run twice, both ways through the forward: the command goes in, its output comes back.
    for _ in range(2):
        out = on_laptop("run", "--", "sh", "-c", "echo rank=$NODE_RANK host=$(hostname)")
        text = out.stdout + out.stderr
        assert f"rank=0 host={name}-0" in text and f"rank=1 host={name}-1" in text, text
    shell = on_laptop("shell", "--host", "1", "--", "sh", "-c", "hostname; exit 3", check=False)
    assert shell.returncode == 3 and f"{name}-1" in shell.stdout, shell.stdout + shell.stderr
    assert "rank=1" in on_laptop("logs").stdout
    # A gather mount's own process goes through the port-forward too: each pod's files, read here.
    from monarch_rdmafs.mount import fuse_unavailable_reason

    if not fuse_unavailable_reason():
        (tmp_path / "gather.py").write_text(GATHER_PROGRAM)
        for i in range(2):
            (tmp_path / "served" / f"hosts_{i}").mkdir(parents=True)
            (tmp_path / "served" / f"hosts_{i}" / "who").write_text(f"pod{i}")
        seen = on_laptop("run", str(tmp_path / "gather.py"), str(tmp_path / "served"))
        assert "seen: pod0 pod1" in seen.stdout, seen.stdout + seen.stderr
    # A controller program: actors on the pods answer it through the relay.
    actors = on_laptop("run", os.path.join(ROOT, "examples", "actors.py"))
    assert f"rank 0 on {name}-0" in actors.stdout and f"rank 3 on {name}-1" in actors.stdout, actors.stdout
    job_dir = next(str(p.parent) for p in tmp_path.joinpath(".monarch").rglob("kubernetes.json"))

    def forwarder() -> int:
        return json.loads((Path(job_dir) / "kubernetes.json").read_text())["forwarder"]["pid"]

    # Loopback is shared with the machine's other users: the proxy wants the job's token.
    socks_port = int(json.loads((Path(job_dir) / "route.json").read_text())["socks"].rsplit(":", 1)[1])
    refused = subprocess.run(netns.enter_argv(laptop, [sys.executable, "-c", SOCKS_WRONG_PASSWORD, str(socks_port)]),
                             capture_output=True, text=True, timeout=30)
    assert refused.stdout.strip() == "0101", refused.stdout + refused.stderr
    # The forward killed: the next command starts it again and goes on.
    first = forwarder()
    os.kill(first, 9)
    out = on_laptop("run", "--", "sh", "-c", "echo again=$NODE_RANK")
    assert "again=0" in out.stdout + out.stderr and "again=1" in out.stdout + out.stderr
    assert forwarder() != first and _alive(forwarder())
    last = forwarder()
    on_laptop("stop")
    assert not _alive(last)
    assert not (Path(job_dir) / "route.json").exists()
    assert kubectl(cluster, "get", "pods,secrets,statefulsets", "-l", f"monarch.pytorch.org/mesh-name={name}",
                   "-o", "name").stdout.strip() == ""


SOCKS_WRONG_PASSWORD = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"\\x05\\x01\\x02")
assert s.recv(2) == b"\\x05\\x02"
s.sendall(b"\\x01\\x07monarch\\x05wrong")
print(s.recv(2).hex())
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


GATHER_PROGRAM = """
import os, sys
from monarch.gather_mount import gather_mount
from monarch.job import job_load

with gather_mount(job_load().state().hosts, sys.argv[1] + "/$SUBDIR", os.path.abspath("seen")):
    print("seen:", " ".join(open(f"seen/hosts_{i}/who").read() for i in range(2)))
"""
