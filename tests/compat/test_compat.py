"""Programs in Monarch's API that get their hosts through the job API, run as a user runs them
(``python program.py`` in a fresh working directory), checked by what they print and leave.

The programs are the files beside this one, each written for these tests; each says what it
exercises.  ``slurm_allreduce.py`` runs on the real Slurm cluster in ``tests/schedulers/test_slurm_job_api.py``.
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


def without_admin_banner(stdout: str) -> str:
    """``stdout`` less the lines a job's mesh admin server says where it listens with (its
    ``Mesh admin server listening on URL`` and the indented lines right after it), as both
    monarch and torchmonarch print them when ``state()`` starts it."""
    kept, in_banner = [], False
    for line in stdout.splitlines(keepends=True):
        if line.startswith("Mesh admin server listening on "):
            in_banner = True
            continue
        if in_banner and line.startswith("  "):
            continue
        in_banner = False
        kept.append(line)
    return "".join(kept)


@pytest.fixture
def cwd(tmp_path, no_leaked_processes):
    yield tmp_path
    monarch("stop", "--force", cwd=tmp_path)


TEAMS_OUT = """\
['red0', 'red1'] ['blue0', 'blue1']
red0 pairs with blue0
red1 pairs with blue1
blue0 pairs with red0
blue1 pairs with red1
red0 served, blue0 returned it
red1 served, blue1 returned it
['blue0 served, red0 returned it', 'blue1 served, red1 returned it']
red heard [['ball 2 from blue0'], ['ball 2 from blue1']]
blue heard [['ball 1 from red0'], ['ball 1 from red1']]
teams done
"""


def test_two_teams_of_actors_talk_across_the_hosts_of_a_process_job(cwd):
    r = run_program("teams_across_hosts.py", cwd)
    assert r.stdout == TEAMS_OUT
    logs = {}
    for host in ("host0", "host1"):
        logs[host] = "".join(open(p).read() for p in glob.glob(str(cwd / ".monarch/jobs/*/logs" / host / "procs/*.log")))
    # red lives on host0 and blue on host1: what each actor printed is in its own host's proc logs.
    assert "player red0 received: ball 2 from blue0" in logs["host0"] and "player blue" not in logs["host0"]
    assert "player blue1 received: ball 1 from red1" in logs["host1"] and "player red" not in logs["host1"]
    # job.kill() released the reservation: `monarch status` has none.
    assert monarch("status", cwd=cwd).returncode == 3


def test_data_parallel_training_through_spmd_actors(cwd):
    out = cwd / "out"
    out.mkdir()
    r = run_program("spmd_training/launch.py", cwd, env={"COMPAT_OUT": str(out)})
    assert r.stdout.strip().endswith("training finished on 2 ranks")
    assert sorted((out / f).read_text() for f in os.listdir(out)) == [
        "local_rank=0 world=2 same_weights=True\n", "local_rank=1 world=2 same_weights=True\n"]


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
    assert st.returncode == 0 and "2 hosts" in st.stdout + st.stderr
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


FRAME_LIMIT_OUT = """\
limit 2097152 passes: 1048576
limit 1048576
small call: 3
a 1 MiB call was refused: SupervisionError
the hook heard of it: True
then: 4
a 2 MiB answer was refused: True True
still: 1000
default limit 10737418240
"""


def test_a_message_over_codec_max_frame_length_fails_its_call_and_only_it(tmp_path, no_leaked_processes):
    """A call whose arguments, or an answer, is longer than codec_max_frame_length fails with
    SupervisionError naming the setting, at once; the actor and the connection to it go on (the
    proc applies its client's limit: the answer is refused there)."""
    e = {**os.environ, "PYTHONPATH": ROOT}
    e.pop("MONARCH_JOB", None)
    r = subprocess.run([sys.executable, os.path.join(HERE, "frame_limit.py"), "after"], cwd=tmp_path, env=e,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == FRAME_LIMIT_OUT
