"""monarch.job.spmd with a TorchX AppDef on the real 4-node Slurm cluster: serve reserves the
nodes once (num_replicas -> nodes, scheduler_cfg -> sbatch options), run_spmd runs the role on
every node twice on the same allocation, and kill() scancels it, leaving nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.cli.conftest import ROOT
from tests.schedulers.conftest import assert_released

pytestmark = pytest.mark.timeout(180)


def test_appdef_on_slurm_reserve_once_run_twice(workdir):
    script = workdir / "driver.py"
    script.write_text(textwrap.dedent("""
        import json
        from torchx import specs
        from monarch.job.spmd import serve

        app = specs.AppDef("hello", roles=[specs.Role(
            name="trainer", image="", entrypoint="sh", num_replicas=2,
            args=["-c", "echo node=$SLURMD_NODENAME rank=$NODE_RANK of $NNODES replica=${replica_id} master=$MASTER_ADDR"])])
        job = serve(app, scheduler="slurm", scheduler_cfg={"partition": "debug", "time": "0:10:00"})
        print("JOB", job.record.job_id, job.record.job_dir)
        pids = [h.pid for h in job.record.hosts]
        job.run_spmd()
        job.run_spmd()
        print("SAME_AGENTS", [h.pid for h in job.record.hosts] == pids)
        job.kill()
    """))
    r = subprocess.run([sys.executable, str(script)], cwd=workdir, capture_output=True, text=True, timeout=150,
                       env={**os.environ, "PYTHONPATH": ROOT})
    m = re.search(r"JOB (\S+) (\S+)", r.stdout)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        for node, rank in (("n1", 0), ("n2", 1)):
            lines = re.findall(rf"\[\w+\] node={node} rank={rank} of 2 replica={rank} master=\S+", r.stdout)
            assert len(lines) == 2, r.stdout
        assert "SAME_AGENTS True" in r.stdout
    finally:
        if m:
            subprocess.run(["scancel", m.group(1)], capture_output=True)
    assert_released(m.group(1), m.group(2))
    assert not (workdir / ".monarch" / "job_state.pkl").exists()
