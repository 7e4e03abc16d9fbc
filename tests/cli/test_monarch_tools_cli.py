"""PyTorch Monarch's argparse CLI (``python -m monarch.tools.cli``, ``monarch/tools``) on real local
reservations: its parser, its contexts (folders of ``.monarch/`` and the ``job_state.pkl`` link that
our own commands follow), apply / exec / kill of a job object with remote and gather mounts (the
gather mounts served between commands by the context's mount process), and its one-line errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.cli.conftest import ROOT, monarch
from tests.helpers import alive


def tools(*args, cwd, input=None, timeout=180, check=False) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    e.pop("MONARCH_JOB", None)
    r = subprocess.run([sys.executable, "-m", "monarch.tools.cli", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=e, input=input)
    if check and r.returncode != 0:
        raise AssertionError(f"monarch.tools.cli {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture
def tooldir(no_leaked_processes, workdir):  # the reservation is stopped before the leak check
    os.mkdir(workdir / ".monarch")
    return workdir


def test_parser_has_monarchs_subcommands_arguments_and_guide():
    from monarch.tools.cli import _parse_duration, get_parser

    parser = get_parser()
    a = parser.parse_args(["exec", "--mesh", "workers", "--per-host", "gpu=4", "-e", "K=V", "--workdir", "/w",
                           "--kill", "--script", "-", "--", "x"])
    assert (a.mesh, a.per_host, a.env, a.workdir, a.kill, a.script, a.cmd) == \
        ("workers", "gpu=4", ["K=V"], "/w", True, "-", ["--", "x"])
    for exclusive in (["--all", "--one"], ["--mesh", "m", "--point", "hosts=0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["exec", *exclusive, "true"])
    assert parser.parse_args(["dashboard", "mast", "j"]).dashboard_port == 8265
    assert parser.parse_args(["tui", "-a", "host:1"]).refresh_ms == 2000
    assert [_parse_duration(v) for v in ("250ms", "3s", "1.5m", "2h")] == [0.25, 3.0, 90.0, 7200.0]
    assert "Job reuse:" in parser.epilog and "--per-host" in parser.epilog


def test_contexts_are_folders_and_the_link_names_the_active_one(tooldir):
    dot = tooldir / ".monarch"
    assert tools("context", "ls", cwd=tooldir).stdout == "No contexts.\n"
    assert tools("context", "create", "scratch", cwd=tooldir, check=True).stdout == "Created context 'scratch'\n"
    assert (dot / "scratch").is_dir() and not (dot / "job_state.pkl").exists()  # create does not switch

    (dot / "job_state.pkl").write_bytes(b"an older plain state file")
    assert tools("context", "use", "work", cwd=tooldir, check=True).stdout == "Switched to context 'work'\n"
    assert os.readlink(dot / "job_state.pkl") == os.path.join("work", "state.pkl")
    assert (dot / "default" / "state.pkl").read_bytes() == b"an older plain state file"  # kept as 'default'
    assert tools("context", "ls", cwd=tooldir).stdout == "  default\n  scratch\n* work\n"
    assert oct(dot.stat().st_mode & 0o777) == "0o700"  # it holds reservations: this user's alone

    # Our own commands follow the link: `monarch status` looks for the reservation of 'work'.
    r = monarch("status", cwd=tooldir)
    assert r.returncode != 0 and "work" not in r.stdout

    assert tools("context", "rm", "work", cwd=tooldir, check=True).stdout == "Removed context 'work'\n"
    assert os.readlink(dot / "job_state.pkl") == os.path.join("default", "state.pkl") and not (dot / "work").exists()

    r = tools("context", "use", "../elsewhere", cwd=tooldir)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "bad context name" in r.stderr, r.stderr
    r = tools("context", "create", "jobs", cwd=tooldir)  # monarch's own folder of .monarch/
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "taken" in r.stderr, r.stderr


def test_bad_input_is_one_line_and_a_nonzero_exit(tooldir):
    (tooldir / "jobs_mod.py").write_text("not_a_job = 3\n")
    for args, words in [(["exec"], "no command specified"),
                        (["apply", "no_such_module.job"], "No module named 'no_such_module'"),
                        (["apply", "jobs_mod.not_a_job"], "must be a JobTrait"),
                        (["exec", "--", "true"], "No spec found"),
                        (["kill"], "no job to kill"),
                        (["exec", "--per-host", "gpu", "true"], "--per-host expects DIM=N"),
                        (["query", "SELECT 1"], "no active job"),
                        (["dashboard", "mast", "j"], "Meta-internal"),
                        (["tui", "--addr", "x"], "monarch tui")]:
        r = tools(*args, cwd=tooldir)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("monarch: ") and r.stderr.count("\n") == 1 and words in r.stderr, (args, r.stderr)
    assert not (tooldir / ".monarch" / "default" / "spec").exists()  # a path that names no job is not saved


JOB = """\
import os
from monarch.job import ProcessJob

here = os.path.dirname(os.path.abspath(__file__))
job = ProcessJob({"hosts": 2})
job.remote_mount(os.path.join(here, "src"), mntpoint=os.path.join(here, "mnt", "$SUBDIR"))
job.gather_mount(os.path.join(here, "hostdata", "$SUBDIR"), os.path.join(here, "gathered"))
"""


def _mount_pid(state_dir) -> int:
    import json

    with open(state_dir / ".state.pkl.mounts.json") as f:
        return json.load(f)["pid"]


def test_apply_exec_kill_with_remote_and_gather_mounts(tooldir):
    from monarch_rdmafs.mount import fuse_unavailable_reason, is_mounted

    why = fuse_unavailable_reason()
    if why:
        pytest.skip(f"FUSE: {why}")
    (tooldir / "src").mkdir()
    (tooldir / "src" / "hello.txt").write_text("v1\n")
    for i in range(2):
        (tooldir / "hostdata" / f"hosts_{i}").mkdir(parents=True)
        (tooldir / "hostdata" / f"hosts_{i}" / "out.txt").write_text(f"host {i}\n")
    (tooldir / "myjob.py").write_text(JOB)
    gathered = str(tooldir / "gathered")
    state_dir = tooldir / ".monarch" / "default"

    r = tools("apply", "myjob.job", cwd=tooldir, check=True)
    assert re.fullmatch(r"Job is ready \(\d+s\)\n", r.stdout), r.stdout
    assert (state_dir / "spec").read_text() == "myjob.job"
    assert os.readlink(tooldir / ".monarch" / "job_state.pkl") == os.path.join("default", "state.pkl")
    # The gather mount outlives the command: the context's mount process serves it.
    assert is_mounted(gathered)
    assert (tooldir / "gathered" / "hosts_1" / "out.txt").read_text() == "host 1\n"
    keeper = _mount_pid(state_dir)
    assert alive(keeper)
    from monarch.job import job_load

    agents = [p.pid for p in job_load(str(tooldir / ".monarch" / "job_state.pkl"))._host_to_pid.values()]
    assert len(agents) == 2 and all(alive(p) for p in agents)  # each host's agent, a process here
    # One reservation for both CLIs: ours sees it through the link.
    assert monarch("status", cwd=tooldir).returncode == 0

    r = tools("exec", "cat", str(tooldir / "mnt" / "hosts_0" / "hello.txt"), cwd=tooldir, check=True)
    assert r.stdout == "v1\n"
    (tooldir / "src" / "hello.txt").write_text("v2\n")  # every command refreshes the remote mount
    r = tools("exec", "cat", str(tooldir / "mnt" / "hosts_1" / "hello.txt"), cwd=tooldir, check=True)
    assert r.stdout == "v2\n"
    (tooldir / "hostdata" / "hosts_0" / "out.txt").write_text("changed\n")
    assert (tooldir / "gathered" / "hosts_0" / "out.txt").read_text() == "changed\n"

    # --all: each rank's output goes to a file under the gather mount's folder on its host, seen here
    # (MONARCH_RANK_<dim> is named by the dimension as it is spelled, as in Monarch).
    r = tools("exec", "--all", "--", "sh", "-c", "echo rank $MONARCH_RANK_hosts", cwd=tooldir, check=True)
    m = re.match(r"Output → (\S+)/<rank>/exec_outputs/(\w+)/\n", r.stdout)
    assert m and m.group(1) == gathered, r.stdout
    for i in range(2):
        assert (tooldir / "gathered" / f"hosts_{i}" / "exec_outputs" / m.group(2) / "stdout.txt").read_text() == \
            f"rank {i}\n"

    assert tools("exec", "--", "sh", "-c", "exit 3", cwd=tooldir).returncode == 3
    script = tools("exec", "--script", "-", cwd=tooldir, input="echo scripted\n", check=True)
    assert script.stdout == "scripted\n"

    tools("apply", cwd=tooldir, check=True)  # the saved spec again: the same reservation and mount process
    assert _mount_pid(state_dir) == keeper

    assert tools("kill", cwd=tooldir, check=True).stdout == "Killed context 'default'\n"
    deadline = time.monotonic() + 30
    while (alive(keeper) or is_mounted(gathered)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(keeper) and not is_mounted(gathered)
    assert not any(alive(p) for p in agents)  # gone, or dead and waiting for PID 1 to reap them
    assert not (state_dir / "state.pkl").exists() and monarch("status", cwd=tooldir).returncode != 0

    # After a kill, exec applies the saved job again before it runs.
    r = tools("exec", "echo", "again", cwd=tooldir, check=True)
    assert r.stdout == "again\n"
    tools("kill", cwd=tooldir, check=True)
