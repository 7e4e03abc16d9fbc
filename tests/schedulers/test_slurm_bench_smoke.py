"""Smoke test: benchmarks/slurm_bench.py --quick --json runs on the test cluster and reports every
measurement and ratio.

It lives here, not in tests/benchmarks, for the ``slurm_cluster`` fixture (conftest.py).  No
thresholds: the numbers depend on the machine; this only checks that each measurement ran and
produced a number, and that the benchmark left no job behind.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from monarch_schedulers.agent_launch import project_root

SCRIPT = os.path.join(project_root(), "benchmarks", "slurm_bench.py")


@pytest.mark.timeout(180)
def test_slurm_bench_quick_json(slurm_cluster, tmp_path):
    p = subprocess.run([sys.executable, SCRIPT, "--quick", "--json"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=170)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    out = json.loads(p.stdout)
    assert out["hosts"] == 4
    assert set(out["results"]) == {
        "monarch serve -> 4 agents ready", "salloc -N4 srun hostname", "salloc -N4 srun python -c pass",
        "sbatch -N4 srun python, until all ran", "monarch stop (scancel, agents gone)",
        "monarch run -- hostname (4 nodes, warm)", "srun hostname in salloc (4 nodes)",
        "monarch run -- python -c pass (4 nodes, warm)", "srun python -c pass in salloc (4 nodes)",
    }
    for name, r in out["results"].items():
        assert r["n"] >= 1 and all(isinstance(r[k], float) and r[k] > 0 for k in ("p50_ms", "p90_ms")), (name, r)
    assert len(out["ratios"]) == 7
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in out["ratios"].values()), out["ratios"]
    q = subprocess.run(["squeue", "-h", "-o", "%A %j"], capture_output=True, text=True)
    assert q.stdout.strip() == "", f"jobs left behind: {q.stdout}"
