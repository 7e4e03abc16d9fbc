"""Real Monarch programs that get their hosts through the job API, run unchanged as a user runs
them (``python program.py`` in a fresh working directory), checked by what they print and leave.

The programs are the files beside this one; each says where it comes from and what, if anything,
was changed (a GPU-only line on this CPU-only machine).  ``slurm_ddp.py`` runs on the real Slurm
cluster in ``tests/schedulers/test_slurm_job_api.py``.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from tests.cli.conftest import monarch
from tests.helpers import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))


def run_program(name: str, cwd, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    e.pop("MONARCH_JOB", None)
    r = subprocess.run([sys.executable, os.path.join(HERE, name)], cwd=cwd, env=e, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{name} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture
def cwd(tmp_path, no_leaked_processes):
    yield tmp_path
    monarch("stop", "--force", cwd=tmp_path)


def test_ping_pong_across_the_hosts_of_a_process_job(cwd):
    r = run_program("ping_pong_multihost.py", cwd)
    assert r.stdout.strip().endswith("Example completed successfully!")
    logs = {}
    for host in ("host0", "host1"):
        logs[host] = "".join(open(p).read() for p in glob.glob(str(cwd / ".monarch/jobs/*/logs" / host / "procs/*.log")))
    # actor_0 lives on host0 and actor_1 on host1: each received the other's ping.
    assert logs["host0"].count("Pong!, Receiver (actor_0:") == 2 and "Sender (actor_1:" in logs["host0"]
    assert logs["host1"].count("Pong!, Receiver (actor_1:") == 2 and "Sender (actor_0:" in logs["host1"]
    assert logs["host0"].count("Identity: ") == 8
    # job.kill() released the reservation: `monarch status` has none.
    assert monarch("status", cwd=cwd).returncode == 3


def test_spmd_actor_ddp_example(cwd):
    out = cwd / "out"
    out.mkdir()
    r = run_program("spmd_ddp/spmd_ddp.py", cwd, env={"COMPAT_OUT": str(out)})
    assert "DDP example completed successfully!" in r.stdout
    assert sorted(os.listdir(out)) == ["rank0", "rank1"]
    assert {(out / f).read_text().split(" ", 1)[1].strip() for f in os.listdir(out)} == {"world=2 in_sync=True"}


def test_port_forwarder_to_a_toy_http_server_on_a_host(cwd):
    r = run_program("port_forward_http.py", cwd)
    lines = r.stdout.splitlines()
    assert sum("hello from rank 0" in line for line in lines) == 4
    assert any(line.endswith("/b: hello from rank 0 on " + os.uname().nodename + " path=/b") for line in lines)
    assert lines[-1] == "forwards closed after stop()"


def test_a_job_cached_by_one_process_is_reloaded_by_job_load_in_another(cwd):
    first = run_program("cache_job.py", cwd)
    assert "['hello from rank 0', 'hello from rank 1']" in first.stdout
    assert os.path.exists(cwd / ".monarch" / "job_state.pkl")
    st = monarch("status", cwd=cwd)  # the cached job is a live reservation `monarch status` shows
    assert st.returncode == 0 and "2 hosts" in st.stderr
    second = run_program("reload_job.py", cwd)
    apply_ids = [line for line in (first.stdout + second.stdout).splitlines() if line.startswith("apply_id=")]
    assert len(apply_ids) == 2 and apply_ids[0] == apply_ids[1]   # the same allocation, not a new one
    assert "['hello again from rank 0', 'hello again from rank 1']" in second.stdout
    assert second.stdout.strip().endswith("active=False")
    assert not os.path.exists(cwd / ".monarch" / "job_state.pkl")


TWO_JOBS_OUT = """\
0 A ['A:1', 'A:1', 'A:1', 'A:1']
0 B ['B:1', 'B:1', 'B:1', 'B:1']
0 local local:1
1 A ['A:2', 'A:2', 'A:2', 'A:2']
1 B ['B:2', 'B:2', 'B:2', 'B:2']
1 local local:2
inside A ['a:100', 'a:100', 'a:100', 'a:100']
inside B ['b:100', 'b:100', 'b:100', 'b:100']
port A
port B
done
"""


def test_one_program_holds_meshes_of_two_reservations_and_this_host(tmp_path, no_leaked_processes):
    """Two `monarch serve` in two folders (two jobs, two sets of keys) and this_host() in one program:
    each mesh is called through its own job's runtime, an actor calls a mesh of its own job, and a
    port the client opened reaches actors of both jobs."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    try:
        for d in dirs:
            d.mkdir()
            monarch("serve", "--hosts", "2", "--procs-per-host", "1", cwd=d, check=True)
        args = [str(d / ".monarch" / "job_state.pkl") for d in dirs]
        e = {**os.environ, "PYTHONPATH": ROOT}
        e.pop("MONARCH_JOB", None)
        r = subprocess.run([sys.executable, os.path.join(HERE, "two_jobs.py"), *args], cwd=tmp_path, env=e,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout == TWO_JOBS_OUT
    finally:
        for d in dirs:
            monarch("stop", "--force", cwd=d)
