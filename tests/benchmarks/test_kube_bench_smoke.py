"""Smoke test: benchmarks/kube_bench.py --quick --json runs both reservations and reports every figure
(no thresholds: the numbers depend on the machine)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake cluster and the outside client's network namespace need root")
def test_kube_bench_quick_json() -> None:
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "kube_bench.py"), "--quick", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    for key in ("run_p50_ms", "run_p90_ms", "call_one_p50_us", "call_one_p99_us", "echo_4MiB_MiBps"):
        assert set(out[key]) == {"direct", "port-forward", "ratio"}
        assert all(math.isfinite(v) and v > 0 for v in out[key].values()), out[key]
