"""submitit's cluster="monarch" on a real Slurm reservation, through benchmarks/submitit_bench.py --quick
(which also runs cluster="slurm" and "local" on the same cluster). No thresholds: it checks every figure
was measured and every result came back right (the benchmark asserts results), and that no job is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from monarch_schedulers.agent_launch import project_root

pytest.importorskip("submitit")
SCRIPT = os.path.join(project_root(), "benchmarks", "submitit_bench.py")


@pytest.mark.timeout(300)
def test_submitit_on_slurm_reservation(slurm_cluster, tmp_path):
    p = subprocess.run([sys.executable, SCRIPT, "--quick", "--json"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=280)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    try:
        out = json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"not JSON:\n{p.stdout[:2000]}\nstderr:\n{p.stderr[-2000:]}") from None
    assert set(out["results"]) == {"monarch submit().result()", "monarch map_array", "slurm submit().result()",
                                   "local submit().result()", "local map_array"}
    assert all(v > 0 for v in out["ratios"].values()), out
    q = subprocess.run(["squeue", "-h", "-o", "%A %j"], capture_output=True, text=True)
    assert q.stdout.strip() == "", f"jobs left behind: {q.stdout}"
