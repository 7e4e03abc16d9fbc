"""Smoke test: benchmarks/hotpath_cost.py measures both workloads on a one-proc mesh at a small size
and says what each end spent per call (CPU time; its callgrind mode is the same run under valgrind,
minutes long, not run here).  No thresholds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "hotpath_cost.py")


@pytest.mark.timeout(300)
def test_hotpath_cost_small_runs_and_reports() -> None:
    p = subprocess.run([sys.executable, SCRIPT, "--calls", "200", "--repeat", "1", "--no-torch", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=280, env={**os.environ, "PYTHONPATH": REPO})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["calls"] == 200 and out["proc_pid"] != os.getpid() and "load" in out
    for mode in ("outstanding", "roundtrip"):
        r = out[mode]
        assert r["rate_per_s"] > 0 and r["client_cpu_us"] >= 0 and r["proc_cpu_us"] >= 0, (mode, r)
