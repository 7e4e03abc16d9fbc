"""The Kubernetes scheduler against the FAKE API server of tests/fakes/kube (real REST, real client,
real kubectl; pods are local host-agent processes started by the fake kubelet)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

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
    pids = set(cluster.kubelet.pids())
    monarch("run", "--", "true", cwd=str(tmp_path))
    assert set(cluster.kubelet.pids()) == pids  # same pods, no new ones
    st = json.loads(monarch("--json", "status", cwd=str(tmp_path)).stdout)
    assert st["state"] == "RUNNING" or st.get("scheduler_state") == "RUNNING", st
    describe = kubectl(cluster, "describe", "statefulset", name).stdout
    assert name in describe
    monarch("stop", cwd=str(tmp_path))
    left = kubectl(cluster, "get", "pods,secrets,services,statefulsets", "-l",
                   f"monarch.pytorch.org/mesh-name={name}", "-o", "name").stdout.strip()
    assert left == ""
    assert not cluster.kubelet.running
