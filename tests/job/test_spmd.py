"""monarch.job.spmd: serve a torchrun program once, run_spmd() many times, reload from the state file.

The end-to-end tests drive the API from a separate Python process (as a user's
script would): one process talks to one job, and this test process has its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from torchx import specs

from monarch.errors import UsageError
from monarch.job.spmd import SPMDProgram, _spec_for, program_of
from tests.cli.conftest import ROOT, monarch
from tests.helpers import wait_gone

TRAIN = os.path.join(ROOT, "examples", "train_ddp.py")


# -- reading a command or an AppDef ---------------------------------------------------------


def test_command_list_shape():
    p = program_of(["torchrun", "--nnodes=2", "--nproc-per-node=3", "train.py", "--lr", "1"])
    assert (p.hosts, p.nproc_per_node, p.source) == (2, 3, "command")
    assert program_of(["torchrun", "--nproc_per_node", "4", "--standalone", "t.py"]).hosts == 1
    assert program_of([sys.executable, "-m", "torch.distributed.run", "--nnodes", "3:3", "t.py"]).hosts == 3
    assert program_of(["python", "train.py"]).nproc_per_node == 1
    assert program_of(["torchrun", "--nproc-per-node=gpu", "t.py"]).nproc_per_node == 1


@pytest.mark.parametrize("cmd, match", [
    ([], "needs a command"),
    (["torchrun", "--standalone", "--nnodes=2", "t.py"], "--standalone runs on one host"),
    (["torchrun", "--nnodes=1:4", "t.py"], "elastic"),
    (["torchrun", "--nnodes=two", "t.py"], "not a number"),
])
def test_command_list_refused(cmd, match):
    with pytest.raises(UsageError, match=match):
        program_of(cmd)


def test_appdef_shape():
    app = specs.AppDef("train", roles=[specs.Role(
        name="trainer", image="", entrypoint="torchrun", args=["--nnodes=2", "--nproc-per-node=2", "t.py"],
        env={"LR": "0.1"}, num_replicas=2, resource=specs.Resource(cpu=2, gpu=8, memMB=1024))])
    p = program_of(app)
    assert p == SPMDProgram(["torchrun", "--nnodes=2", "--nproc-per-node=2", "t.py"], hosts=2, nproc_per_node=2,
                            env={"LR": "0.1"}, source="appdef:train", gpus_per_node=8)
    spec = _spec_for(p, "slurm", {"partition": "debug", "time": "0:10:00"})
    assert (spec.scheduler, spec.hosts, spec.procs_per_host) == ("slurm", 2, 2)
    assert spec.options == {"partition": "debug", "time": "0:10:00", "gpus_per_node": 8}


def test_appdef_refused():
    role = specs.Role(name="r", image="", entrypoint="torchrun", args=["--nnodes=3", "t.py"], num_replicas=2)
    with pytest.raises(UsageError, match="num_replicas=2 but its torchrun asks for --nnodes=3"):
        program_of(specs.AppDef("a", roles=[role]))
    with pytest.raises(UsageError, match="has 2 roles"):
        program_of(specs.AppDef("a", roles=[role, role]))
    with pytest.raises(UsageError, match="command list or a TorchX AppDef"):
        program_of("torchrun train.py")


@pytest.mark.parametrize("scheduler, cfg, match", [
    ("kubernetes_mcad", None, "unknown scheduler"),
    ("slurm", {"partitoin": "x"}, "unknown Slurm option 'partitoin'"),
    ("local_cwd", {"partition": "x"}, "scheduler_cfg is for Slurm"),
])
def test_scheduler_refused(scheduler, cfg, match):
    with pytest.raises(UsageError, match=match):
        _spec_for(SPMDProgram(["python", "t.py"]), scheduler, cfg)


def test_run_spmd_without_a_program_says_what_to_pass(tmp_path):
    # A reservation made by `monarch serve` has no SPMD program: run_spmd() needs a command.
    from monarch_agents.keys import JobKeys
    from monarch.job.spmd import SPMDJob
    from monarch._workbench.state import JobRecord, JobSpec

    record = JobRecord("default", JobSpec(), "local-x", str(tmp_path), JobKeys("a", "b", "c", "d"))
    job = SPMDJob(record, str(tmp_path / "job_state.pkl"))
    assert job.program is None
    with pytest.raises(UsageError, match="has no SPMD program") as e:
        job.run_spmd()
    assert "job.run_spmd([" in e.value.hint


# -- end to end on the local scheduler ------------------------------------------------------


def _python(workdir, code: str, timeout: float = 240) -> subprocess.CompletedProcess:
    script = workdir / "driver.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], cwd=workdir, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": ROOT,
                               # `torchrun` resolves to this environment's, as in an activated venv.
                               "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})


@pytest.fixture
def workdir(tmp_path):
    yield tmp_path
    monarch("stop", "--force", cwd=tmp_path, timeout=60)


def test_serve_run_spmd_twice_then_reload_in_another_process(workdir):
    r = _python(workdir, f"""
        import json
        from monarch.job.spmd import serve
        job = serve(["torchrun", "--nnodes=2", "--nproc-per-node=2", {TRAIN!r}], scheduler="local_cwd")
        pids = [h.pid for h in job.record.hosts]
        for _ in range(2):
            result = job.run_spmd()
            print("RESULT", result.run_id, json.dumps(result.exit_codes))
        print("PIDS", json.dumps(pids))
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = re.findall(r"\[host0\] final_loss ([0-9.]+) world 4", r.stdout)
    assert len(losses) == 2 and losses[0] == losses[1], r.stdout
    assert r.stdout.count('RESULT') == 2 and '{"0": 0, "1": 0}' in r.stdout
    pids = re.search(r"PIDS (\[.*\])", r.stdout).group(1)

    # Another process: the state file alone brings the job back, on the same agents.
    r = _python(workdir, f"""
        import json
        from monarch.job import job_load
        from monarch.job.spmd import serve
        job = job_load(".monarch/job_state.pkl")
        print(type(job).__name__, job.program.argv[0], job.program.hosts)
        job.run_spmd(["sh", "-c", "echo again-$NODE_RANK-of-$NNODES"])
        # serve() with the same program reuses the reservation rather than making another.
        again = serve(["torchrun", "--nnodes=2", "--nproc-per-node=2", {TRAIN!r}])
        print("PIDS", json.dumps([h.pid for h in again.record.hosts]))
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SPMDJob torchrun 2" in r.stdout
    assert "[host0] again-0-of-2" in r.stdout and "[host1] again-1-of-2" in r.stdout
    assert re.search(r"PIDS (\[.*\])", r.stdout).group(1) == pids

    # `monarch logs` knows runs made through the API.
    logs = monarch("logs", "--list", cwd=workdir, check=True)
    assert logs.stdout.count("\n") >= 3, logs.stdout
    monarch("stop", cwd=workdir, check=True)
    assert wait_gone([int(p) for p in re.findall(r"\d+", pids)]) == []


def test_appdef_macros_failure_and_shape_change(workdir):
    # $MASTER_ADDR and TorchX macros in args are filled in per host; a failing rank raises RunError.
    r = _python(workdir, """
        from torchx import specs
        from monarch.errors import RunError, StateError
        from monarch.job.spmd import serve
        app = specs.AppDef("echo", roles=[specs.Role(
            name="r", image="", entrypoint="sh", num_replicas=2, env={"GREETING": "hi"},
            args=["-c", "echo $GREETING replica=${replica_id} app=${app_id} master=$MASTER_ADDR rank=$0", "$NODE_RANK"])])
        job = serve(app)
        job.run_spmd()
        try:
            # A separate run fails: a rank that fails stops the others, which could cut the lines above.
            job.run_spmd(["sh", "-c", "exit $NODE_RANK"])
        except RunError as e:
            print("RUNERROR", e.message)
        try:
            serve(["torchrun", "--nnodes=3", "t.py"])
        except StateError as e:
            print("STATEERROR", e.message, "|", e.hint)
        job.kill()
        print("KILLED", job.active)
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"\[host0\] hi replica=0 app=local-\w+ master=127.0.0.1 rank=0", r.stdout), r.stdout
    assert re.search(r"\[host1\] hi replica=1 app=local-\w+ master=127.0.0.1 rank=1", r.stdout), r.stdout
    assert "RUNERROR rank 1 on host1 exited with code 1" in r.stdout
    assert "STATEERROR job 'default' is already reserved with a different shape" in r.stdout
    assert "KILLED False" in r.stdout
    assert not (workdir / ".monarch" / "job_state.pkl").exists()
