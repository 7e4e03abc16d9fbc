"""monarch.job.SlurmJob on the real Slurm cluster: a DDP program in Monarch's API
(tests/compat/slurm_allreduce.py) runs across two nodes, and a SlurmJob's reservation is the
one `monarch serve --scheduler slurm` makes (status shows it, serve reuses it, kill scancels it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.cli.conftest import ROOT, monarch
from tests.schedulers.conftest import assert_released, squeue_state

pytestmark = pytest.mark.timeout(240)

COMPAT = os.path.join(ROOT, "tests", "compat")


def _run(args: list[str], cwd, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_monarch_ddp_program_on_a_slurm_job(workdir):
    r = _run([os.path.join(COMPAT, "slurm_allreduce.py")], workdir)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "world sizes: [2]" in r.stdout
    assert "weights agree: [True, True]" in r.stdout
    nodes = r.stdout.split("nodes: ", 1)[1].splitlines()[0]
    assert len(set(eval(nodes))) == 2, nodes          # two different Slurm nodes
    assert "training on the Slurm job finished" in r.stdout
    # slurm_job.kill() in its finally: nothing queued, nothing left running, no state file.
    job_dirs = [os.path.join(workdir, ".monarch", "jobs", d) for d in os.listdir(workdir / ".monarch" / "jobs")]
    assert not os.path.exists(workdir / ".monarch" / "job_state.pkl")
    for d in job_dirs:
        for f in os.listdir(os.path.join(d, "logs")):
            if f.startswith("slurm-") and f.endswith(".out"):
                assert_released(f[len("slurm-"):-len(".out")], d)


def test_slurm_job_is_the_reservation_monarch_serve_makes(workdir):
    make = textwrap.dedent("""
        from monarch.job import SlurmJob
        job = SlurmJob(meshes={"trainers": 1, "evals": 1}, partition="debug", time_limit="0:10:00")
        state = job.state()
        print("JOB", job._running.record.job_id, state.trainers.size(), state.evals.size())
    """)
    r = _run(["-c", make], workdir)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split("JOB ", 1)[1].split()[0]
    assert r.stdout.split("JOB ", 1)[1].split()[1:] == ["1", "1"]
    assert squeue_state(job_id) == "RUNNING"
    st = monarch("--json", "status", cwd=workdir)
    assert st.returncode == 0 and f'"job_id": "{job_id}"' in st.stdout and '"scheduler": "slurm"' in st.stdout
    # `monarch serve` with the same shape reuses it; so does the same SlurmJob in another process.
    sv = monarch("--json", "serve", "--scheduler", "slurm", "--hosts", "2", "--partition", "debug", "--time",
                 "0:10:00", "--exclusive", cwd=workdir)
    assert sv.returncode == 0 and '"reused": true' in sv.stdout, sv.stdout + sv.stderr
    again = _run(["-c", make], workdir)
    assert again.returncode == 0 and f"JOB {job_id} 1 1" in again.stdout, again.stderr
    r = _run(["-c", "from monarch.job import job_load\njob = job_load()\nprint(type(job).__name__)\njob.kill()"],
             workdir)
    assert r.returncode == 0 and r.stdout.strip() == "SlurmJob", r.stderr
    assert_released(job_id, os.path.join(workdir, ".monarch", "jobs", "default"))
