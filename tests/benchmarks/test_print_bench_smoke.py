"""Smoke test: benchmarks/print_bench.py --mb 2 --n 1 --json runs and reports every figure (no thresholds)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "print_bench.py")


def test_print_bench_quick_json() -> None:
    p = subprocess.run([sys.executable, SCRIPT, "--mb", "2", "--n", "1", "--json"], cwd=REPO, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    results = json.loads(p.stdout)
    for key in ("one_line_s", "short_lines_s", "cat_one_s", "cat_short_s", "fixed_s", "one_line_vs_cat",
                "short_lines_vs_cat", "one_line_vs_short_lines"):
        assert isinstance(results[key], float) and math.isfinite(results[key]) and results[key] > 0, (key, results)
