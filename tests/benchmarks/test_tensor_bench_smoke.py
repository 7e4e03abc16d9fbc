"""Smoke test: benchmarks/tensor_bench.py --quick --json runs (ours only) and reports every measurement.

No thresholds: the numbers depend on the machine; this only checks that each measurement ran.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "tensor_bench.py")
EXPECTED_KEYS = ["issue_ops_s", "e2e_ops_s", "fetch_p50_us", "reduce_64MiB_ms", "rdma_read_1MiB_MBps",
                 "rdma_read_256MiB_MBps"]


def test_tensor_bench_quick_json() -> None:
    p = subprocess.run([sys.executable, SCRIPT, "--quick", "--json", "--impl", "monarch"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    out = json.loads(p.stdout)
    results = out["results"]
    assert not out["errors"], out["errors"]
    bad = {k: results.get(k) for k in EXPECTED_KEYS
           if not isinstance(results.get(k), (int, float)) or not math.isfinite(results[k]) or results[k] <= 0}
    assert not bad, f"missing or bad results {bad}\nstderr:\n{p.stderr[-4000:]}"
