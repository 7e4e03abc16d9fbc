"""The `monarch` command on the real 4-node Slurm cluster (``slurm_cluster`` in conftest.py):
serve / run (torchrun with gloo across the nodes) / status / stop, --no-wait picked up from
another working directory through MONARCH_JOB, the time-limit warning, and a job that ends
under a running command.  Every test stops its job in a ``finally`` and checks nothing is left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.cli.conftest import MONARCH, ROOT, monarch
from monarch_agents.transport import addr_host
from tests.schedulers.conftest import NO_NETNS, assert_released, cluster_plan, poll

SLURM = ["--scheduler", "slurm", "--partition", "debug"]

pytestmark = pytest.mark.timeout(180)


def _serve(cwd, *args: str, env: dict | None = None) -> dict:
    r = monarch("--json", "serve", *SLURM, *args, cwd=cwd, env=env, check=True)
    return json.loads(r.stdout)


def _flat(text: str) -> str:
    """Rich wraps stderr to 80 columns when it is not a terminal: compare words, not line breaks."""
    return " ".join(text.split())


def _stop(cwd, env: dict | None = None) -> None:
    monarch("stop", "--force", cwd=cwd, env=env, timeout=60)


def test_serve_torchrun_gloo_on_four_nodes_status_stop(workdir):
    served = _serve(workdir, "--hosts", "4", "--time", "10:00")
    job_dir = str(workdir / ".monarch" / "jobs" / "default")
    try:
        assert served["ready"] and not served["reused"]
        assert sorted(h["host"] for h in served["hosts"]) == ["n1", "n2", "n3", "n4"]
        # One torchrun per node, rendezvous through the env `monarch run` sets (PET_NNODES=4, ...).
        script = os.path.join(ROOT, "examples", "train_ddp.py")
        r = monarch("run", "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", script,
                    cwd=workdir, timeout=150)
        assert r.returncode == 0, r.stdout + r.stderr
        assert re.search(r"^\[n1\] final_loss [0-9.]+ world 4$", r.stdout, re.M), r.stdout + r.stderr
        assert "warning" not in r.stderr  # ten minutes is far from the time limit

        st = json.loads(monarch("--json", "status", cwd=workdir, check=True).stdout)
        assert st["scheduler"] == "slurm" and st["job_id"] == served["job_id"] and st["state"] == "RUNNING"
        assert 0 < st["time_left_s"] <= 600
        assert [(h["host"], h["agent"]) for h in st["hosts"]] == [(f"n{i}", "up") for i in range(1, 5)]
        # The agents listen on their nodes' own addresses (the namespaces'), not the client's.
        plan = cluster_plan()
        ips = [h.ip for h in plan.hosts] if plan else ["127.0.0.1"] * 4
        assert [addr_host(h["addr"]) for h in st["hosts"]] == ips

        r = monarch("stop", cwd=workdir, check=True)
        assert f"stopped job 'default' ({served['job_id']})" in r.stderr
        assert_released(served["job_id"], job_dir)
        assert not (workdir / ".monarch" / "job_state.pkl").exists()
    finally:
        _stop(workdir)


def test_no_wait_then_reattach_from_another_directory(workdir, tmp_path_factory):
    served = _serve(workdir, "--hosts", "2", "--time", "10:00", "--no-wait")
    assert served["ready"] is False and served["hosts"] == []
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    env = {"MONARCH_JOB": served["state_file"]}
    try:
        # The first command after --no-wait waits for the agents, from wherever MONARCH_JOB is set.
        r = monarch("run", "--", "sh", "-c", 'echo "$NODE_RANK/$NNODES $PWD"', cwd=elsewhere, env=env, check=True)
        assert sorted(r.stdout.splitlines()) == [f"[n1] 0/2 {elsewhere}", f"[n2] 1/2 {elsewhere}"]
        st = json.loads(monarch("--json", "status", cwd=elsewhere, env=env, check=True).stdout)
        assert st["job_id"] == served["job_id"] and st["ready"] and st["state"] == "RUNNING"
        assert not (elsewhere / ".monarch").exists()  # nothing of the job lands in the other directory
        monarch("stop", cwd=elsewhere, env=env, check=True)
        assert_released(served["job_id"], str(workdir / ".monarch" / "jobs" / "default"))
        assert not os.path.exists(served["state_file"])
    finally:
        _stop(workdir)


def test_pending_job_shows_its_queue_state_and_a_later_run_picks_it_up(workdir):
    # Another user's job holds every CPU of the 4 nodes, so ours waits in the queue.
    r = subprocess.run(["salloc", "-N4", "--exclusive", "--time=5:00", "--no-shell"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    blocker = re.search(r"Granted job allocation (\d+)", r.stderr).group(1)
    served = {}
    try:
        served = _serve(workdir, "--hosts", "4", "--time", "10:00", "--no-wait")
        # A job has no queue reason until Slurm's scheduler has looked at it once.
        st = poll(lambda: (lambda st: st if st["reason"] else None)(
            json.loads(monarch("--json", "status", cwd=workdir, check=True).stdout)), 30, "a queue reason")
        assert st["state"] == "PENDING" and st["reason"] == "Resources: waiting for free nodes", st
        assert st["hosts"] == [] and st["ready"] is False
        r = monarch("status", cwd=workdir, check=True)
        assert f"{served['job_id']} (4 hosts × 1 proc (slurm)): PENDING — Resources: waiting for free nodes" in _flat(r.stdout)
        subprocess.run(["scancel", blocker], check=True, capture_output=True)
        r = monarch("run", "--", "hostname", cwd=workdir, check=True)
        assert sorted(line.split()[0] for line in r.stdout.splitlines()) == ["[n1]", "[n2]", "[n3]", "[n4]"]
    finally:
        subprocess.run(["scancel", blocker], capture_output=True)
        _stop(workdir)
    if served:
        assert_released(served["job_id"], str(workdir / ".monarch" / "jobs" / "default"))


def test_run_and_status_warn_near_the_time_limit(workdir):
    # Slurm's shortest limit, one minute, is inside the default five-minute warning.
    served = _serve(workdir, "--hosts", "1", "--time", "1")
    try:
        r = monarch("run", "--", "echo", "hi", cwd=workdir, check=True)
        assert r.stdout == "[n1] hi\n"
        assert re.search(rf"warning: the reservation \(slurm job {served['job_id']}\) reaches its time limit in [01]:\d\d",
                         _flat(r.stderr)), r.stderr
        r = monarch("run", "--warn-before", "0", "--", "true", cwd=workdir, check=True)
        assert "warning" not in r.stderr
        r = monarch("run", "--", "true", cwd=workdir, env={"MONARCH_WARN_BEFORE": "0"}, check=True)
        assert "warning" not in r.stderr
        r = monarch("status", cwd=workdir, check=True)
        assert "(time limit soon)" in _flat(r.stdout)  # on the job line, which is data (stdout)
        r = monarch("run", "--warn-before", "-1", "--", "true", cwd=workdir)
        assert r.returncode == 2 and "0 or more minutes" in _flat(r.stderr)
    finally:
        _stop(workdir)
    assert_released(served["job_id"], str(workdir / ".monarch" / "jobs" / "default"))


def test_scancel_under_a_run_fails_it_clearly_and_serve_replaces_the_job(workdir):
    served = _serve(workdir, "--hosts", "2", "--time", "10:00")
    job_id = served["job_id"]
    e = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", "COLUMNS": "300"}
    p = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", "echo started; exec sleep 60"], cwd=workdir,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    try:
        assert p.stdout.readline().endswith("started\n")
        assert p.stdout.readline().endswith("started\n")
        subprocess.run(["scancel", job_id], check=True, capture_output=True)
        assert p.wait(timeout=30) != 0
        err = p.stderr.read()
        assert (f"error: the reservation ended during the run (slurm job {job_id}: cancelled (scancel or admin))"
                in _flat(err)), err
        assert "monarch serve" in err
        r = monarch("status", cwd=workdir)
        assert r.returncode == 3 and "cancelled (scancel or admin)" in _flat(r.stderr)
        r = monarch("run", "--", "true", cwd=workdir)
        assert r.returncode == 3 and "is gone: cancelled" in _flat(r.stderr)
        again = _serve(workdir, "--hosts", "2", "--time", "10:00")
        assert again["ready"] and not again["reused"] and again["job_id"] != job_id
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()
        _stop(workdir)
    assert_released(job_id, str(workdir / ".monarch" / "jobs" / "default"))


@pytest.mark.timeout(240)
def test_run_ended_by_the_time_limit(workdir):
    # Slow (60-90 s: Slurm's 1-minute minimum, then its 30 s check) but the only proof that a real
    # time limit reaches a running command as a clear error, so it runs in every suite.
    served = _serve(workdir, "--hosts", "1", "--time", "1")
    try:
        r = monarch("run", "--", "sleep", "300", cwd=workdir, timeout=200, env={"COLUMNS": "300"})
        assert r.returncode != 0
        assert "reaches its time limit in" in r.stderr
        assert f"the reservation ended during the run (slurm job {served['job_id']}: hit its time limit)" in r.stderr
        r = monarch("status", cwd=workdir)
        assert r.returncode == 3 and "hit its time limit" in _flat(r.stderr)
    finally:
        _stop(workdir)
    assert_released(served["job_id"], str(workdir / ".monarch" / "jobs" / "default"))


def test_client_host_the_nodes_cannot_reach_fails_serve_in_one_line(workdir):
    if cluster_plan() is None:
        pytest.skip(f"the nodes share this machine's network stack, where every address routes: {NO_NETNS}")
    # TEST-NET-1: a node in its namespace has no route there (its only link is the cluster's bridge).
    r = monarch("serve", *SLURM, "--hosts", "1", "--time", "5:00", "--client-host", "192.0.2.1", cwd=workdir,
                timeout=90)
    try:
        assert r.returncode != 0
        assert "no route from this host to the client host 192.0.2.1" in _flat(r.stderr), r.stderr
        assert "monarch serve --client-host ADDR" in _flat(r.stderr)
        assert not (workdir / ".monarch" / "job_state.pkl").exists()
        # The failed job is given back (it leaves the queue once its node has cleaned up).
        poll(lambda: "monarch-default" not in subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True,
                                                             text=True).stdout, 20, "the job to leave the queue")
    finally:
        _stop(workdir)


# -- no cluster needed ----------------------------------------------------------------------------


def test_client_host_flag(tmp_path):
    r = monarch("serve", *SLURM, "--hosts", "2", "--client-host", "10.1.2.3", "--dryrun", cwd=tmp_path, check=True)
    assert " --client-host 10.1.2.3 " in r.stdout
    r = monarch("serve", *SLURM, "--client-host", "not an address", "--dryrun", cwd=tmp_path)
    assert r.returncode == 2 and "bad client host" in _flat(r.stderr)
    r = monarch("serve", "--client-host", "10.1.2.3", "--dryrun", cwd=tmp_path)
    assert r.returncode == 2 and "--scheduler slurm" in r.stderr
    assert not (tmp_path / ".monarch").exists()


def test_workspace_synced_to_four_nodes_and_gone_after_stop(workdir):
    from monarch_rdmafs.mount import SUBTYPE, fuse_unavailable_reason

    why = fuse_unavailable_reason()
    if why:
        pytest.skip(f"FUSE cannot be used here: {why}")
    (workdir / "pkg").mkdir()
    (workdir / "pkg" / "__init__.py").write_text("WHERE = 'synced'\n")
    served = _serve(workdir, "--hosts", "4", "--time", "10:00", "--workspace", ".")
    job_dir = str(workdir / ".monarch" / "jobs" / "default")
    mounts = served["workspace"]["mounts"]
    try:
        assert sorted(mounts) == ["n1", "n2", "n3", "n4"] and len(set(mounts.values())) == 4
        r = monarch("run", "--", sys.executable, "-c", "import os, pkg; print(pkg.WHERE, os.getcwd())",
                    cwd=workdir, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        for node, mnt in mounts.items():
            assert f"[{node}] synced {mnt}" in r.stdout
        (workdir / "pkg" / "__init__.py").write_text("WHERE = 'edited'\n")
        r = monarch("run", "--", sys.executable, "-c", "import pkg; print(pkg.WHERE)", cwd=workdir, timeout=120)
        assert r.returncode == 0 and r.stdout.count("edited") == 4, r.stdout + r.stderr
        monarch("stop", cwd=workdir, check=True)
        assert_released(served["job_id"], job_dir)
        with open("/proc/self/mounts") as f:
            left = [line.split()[1] for line in f if line.split()[2] == f"fuse.{SUBTYPE}"]
        assert not set(left) & set(mounts.values())
        # Each agent stopped in order (not scancel's SIGKILL): its store and mount folder are gone too.
        from monarch_rdmafs.location import default_workspace_root

        kept = [default_workspace_root(os.path.join(job_dir, "logs", f"host{i}")) for i in range(4)]
        assert [d for d in kept if os.path.exists(d)] == []
    finally:
        _stop(workdir)
