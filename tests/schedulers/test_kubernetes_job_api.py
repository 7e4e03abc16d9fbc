"""monarch.job.kubernetes.KubernetesJob against the FAKE Kubernetes API server of tests/fakes/kube
(real REST, real client; pods are local host-agent processes): meshes of pods made from an
ImageSpec, reused from another process, seen by `monarch status`, released by kill()."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from monarch.errors import UsageError
from monarch.job.kubernetes import ImageSpec, KubernetesJob
from tests.schedulers.test_kubernetes import BIN, IMAGE, ROOT, cluster, kubectl, monarch  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fake kubelet bind-mounts Secrets (root only)")


def _script(code: str, cwd, kubeconfig: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, "PATH": BIN + os.pathsep + os.environ["PATH"], "KCFG": kubeconfig}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=150)


JOB = """
import os
from monarch.actor import Actor, endpoint, current_rank
from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

class Where(Actor):
    @endpoint
    def where(self):
        return os.environ.get("MONARCH_HOSTNAME")

job = KubernetesJob(namespace="default", kubeconfig=KubeConfig.from_path(os.environ["KCFG"]), timeout=60)
job.add_mesh("trainers", 2, image_spec=ImageSpec(%r, resources={"cpu": 1}))
job.add_mesh("evals", 1, image_spec=ImageSpec(%r, resources={"cpu": 1}))
state = job.state()
procs = state.trainers.spawn_procs(per_host={"gpus": 1})
print("trainers=" + ",".join(sorted(procs.spawn("w", Where).where.call().get().values())))
print("evals=%%d" %% state.evals.size())
print("apply_id=" + job.apply_id)
""" % (IMAGE, IMAGE)


def test_kubernetes_job_meshes_reuse_status_and_kill(cluster, tmp_path):  # noqa: F811
    first = _script(JOB, tmp_path, cluster.kubeconfig)
    assert first.returncode == 0, first.stderr
    lines = dict(line.split("=", 1) for line in first.stdout.splitlines())
    assert len(lines["trainers"].split(",")) == 2 and lines["evals"] == "1"
    st = monarch("status", cwd=str(tmp_path))
    assert "3 hosts" in st.stderr and "kubernetes" in st.stderr
    second = _script(JOB, tmp_path, cluster.kubeconfig)
    assert second.returncode == 0, second.stderr
    assert dict(line.split("=", 1) for line in second.stdout.splitlines())["apply_id"] == lines["apply_id"]
    done = _script("from monarch.job import job_load\nj = job_load()\nprint(type(j).__name__)\nj.kill()",
                   tmp_path, cluster.kubeconfig)
    assert done.returncode == 0 and done.stdout.strip() == "KubernetesJob", done.stderr
    pods = kubectl(cluster, "get", "pods", "-l", "app.kubernetes.io/name=monarch-worker", "-o", "name").stdout.split()
    assert pods == []


def test_kubernetes_job_bad_input():
    job = KubernetesJob(namespace="default")
    with pytest.raises(UsageError, match="no meshes"):
        job._job_spec()
    job.add_mesh("a", 1, image_spec=ImageSpec("img:1"))
    with pytest.raises(UsageError, match="has another pod spec than mesh 'a'"):
        job.add_mesh("b", 1, image_spec=ImageSpec("img:2"))
    with pytest.raises(UsageError, match="must be the job's only mesh"):
        job.add_mesh("c", 1)
    with pytest.raises(UsageError, match="attach_to"):
        KubernetesJob(namespace="default", attach_to="tcp://127.0.0.1:26600")
    with pytest.raises(UsageError, match="label_selector"):
        KubernetesJob(namespace="default").add_mesh("a", 1, label_selector="app=x")
