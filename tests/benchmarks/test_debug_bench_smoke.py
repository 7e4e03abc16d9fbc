"""Smoke test: benchmarks/debug_bench.py --n 3 --json runs and reports every figure (no thresholds)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "debug_bench.py")


def test_debug_bench_quick_json() -> None:
    p = subprocess.run([sys.executable, SCRIPT, "--n", "3", "--json"], cwd=REPO, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    results = json.loads(p.stdout)
    for key in ("attach_api_p50_ms", "attach_cli_p50_ms", "relay_round_trip_p50_ms", "local_pdb_round_trip_p50_ms",
                "relay_round_trip_vs_local_pdb", "attach_cli_vs_local_pdb"):
        assert isinstance(results[key], float) and math.isfinite(results[key]) and results[key] > 0, (key, results)
