"""The real Slurm cluster the tests in this folder share (scripts/slurm_cluster.sh: 4 nodes on
this machine, each in its own network namespace with its own address), and helpers to check
that a job left nothing behind.

The session fixture installs and starts the cluster in a temporary directory, on free ports,
and stops it at the end, checking that its namespaces, veths and bridge are gone; without root
(or without slurmctld and apt-get) the tests that use it are skipped.  Where namespaces cannot
be made (no `ip`/`nsenter`), the nodes share 127.0.0.1 and the multi-host assertions skip,
naming the reason (:func:`cluster_plan`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time

import psutil
import pytest

from monarch_schedulers import netns
from monarch_schedulers.agent_launch import project_root

SCRIPT = os.path.join(project_root(), "scripts", "slurm_cluster.sh")
#: Why the cluster's nodes share this machine's network stack ("" when each has its own namespace).
NO_NETNS = netns.unavailable()


def _free_ports(count: int, consecutive: bool = False) -> list[int]:
    """Ports nothing listens on now (``consecutive``: a block of ``count``)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        ports = list(range(base, base + count)) if consecutive else [base]
        if ports[-1] > 65535:
            continue
        try:
            socks = []
            for p in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return ports
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the Slurm cluster needs root (munged runs as munge, slurmd as root)")
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    if shutil.which("slurmctld", path=path) is None and shutil.which("apt-get") is None:
        pytest.skip("slurmctld is not installed and apt-get is not available to install it")
    # The daemons must not carry the test session's mark (tests/helpers.py): they are not leaks of
    # this session, and munged, shared with any other cluster on the machine, may outlive it.
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_TEST_SESSION"}
    env["PATH"] = path
    if NO_NETNS:
        env["MONARCH_SLURM_NETNS"] = "0"
    # Ports of our own, so a cluster someone already runs here (default ports) does not collide.
    taken = set()
    for var, n, block in (("MONARCH_SLURMCTLD_PORT", 1, False), ("MONARCH_SLURMD_PORT", 1, False),
                          ("MONARCH_SLURM_NODE_PORT", 4, True)):
        while True:
            ports = _free_ports(n, block)
            if not taken & set(ports):
                break
        taken |= set(ports)
        env.setdefault(var, str(ports[0]))
    r = subprocess.run([SCRIPT, "install"], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"slurm_cluster.sh install failed:\n{r.stderr[-3000:]}")
    cluster_dir = str(tmp_path_factory.mktemp("slurm"))
    r = subprocess.run([SCRIPT, "start", cluster_dir], env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.fail(f"slurm_cluster.sh start failed:\n{r.stderr[-3000:]}")
    export = r.stdout.strip().splitlines()[-1]
    assert export.startswith("export SLURM_CONF="), r.stdout
    conf = export.split("=", 1)[1]
    plan = _plan(cluster_dir)
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", conf)
    try:
        assert (plan is None) == bool(NO_NETNS), f"namespaces: {plan}, unavailable because: {NO_NETNS!r}"
        yield conf
    finally:
        mp.undo()
        r = subprocess.run([SCRIPT, "stop", cluster_dir], env=env, capture_output=True, text=True, timeout=120)
        left = netns.left_by(plan.tag) if plan else []
        if r.returncode != 0 or left:
            pytest.fail(f"slurm_cluster.sh stop: rc {r.returncode}, left {left}:\n{r.stderr[-3000:]}")


def _plan(cluster_dir: str) -> netns.NetnsPlan | None:
    try:
        with open(os.path.join(cluster_dir, "netns.json")) as f:
            return netns.NetnsPlan.from_json(json.load(f))
    except FileNotFoundError:
        return None


def cluster_plan() -> netns.NetnsPlan | None:
    """The bridge and node namespaces of the running cluster (node i+1 is ``hosts[i]``), or None
    where its nodes share this machine's network stack (the reason is :data:`NO_NETNS`)."""
    return _plan(os.path.dirname(os.environ["SLURM_CONF"]))


@pytest.fixture
def workdir(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def squeue_state(job_id: str) -> str:
    """What the default squeue listing (jobs not done yet) says about the job."""
    r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return r.stdout.strip()


def leftovers(job_id: str, job_dir: str) -> list[str]:
    """Live processes of the job: its agents (job dir on the command line) or anything in its steps."""
    found = []
    # Job ids start at 1 in every test cluster: SLURM_CONF tells this cluster's jobs from another's.
    conf = os.environ.get("SLURM_CONF")
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            env = p.environ() if job_dir not in cmd else {}
            if job_dir in cmd or (env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_CONF") == conf):
                found.append(f"{p.pid} {cmd[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def assert_released(job_id: str, job_dir: str) -> None:
    assert squeue_state(job_id) == "", f"job {job_id} is still queued"
    # PID 1 reaps orphans lazily; allow a moment for processes that are on their way out.
    deadline = time.monotonic() + 3
    while (left := leftovers(job_id, job_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of job {job_id} remain: {left}"


def poll(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)
