"""Smoke test: benchmarks/dashboard_bench.py --frozen runs and reports every figure (no time thresholds)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "dashboard_bench.py")


def test_dashboard_bench_frozen_quick_json() -> None:
    p = subprocess.run([sys.executable, SCRIPT, "--frozen", "--procs", "200", "--seconds", "1", "--json"], cwd=REPO,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    results = json.loads(p.stdout)
    assert set(results) == {"64/steady", "64/churn", "200/steady", "200/churn"}
    for key, r in results.items():
        assert r["refreshes"] >= 1, (key, r)
        for figure in ("poll_ms", "apply_ms", "process_cpu_per_s"):
            assert math.isfinite(r[figure]) and r[figure] > 0, (key, figure, r)
    # Work, not time: an unchanged mesh relabels nothing; when every rss moves, every proc is relabelled.
    assert results["200/steady"]["relabelled_per_refresh"] == 0
    assert results["200/churn"]["relabelled_per_refresh"] >= 200
