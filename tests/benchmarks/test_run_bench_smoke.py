"""Smoke test: benchmarks/run_bench.py runs one round, with its floors, both ways of running and a timeline.

No thresholds: only that every figure was measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "run_bench.py")


def test_run_bench_one_round() -> None:
    p = subprocess.run([sys.executable, SCRIPT, "--n", "1", "--json", "--timeline"], cwd=REPO, capture_output=True,
                       text=True, timeout=280)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    out = json.loads(p.stdout)
    for name in ("floor: true", "floor: python -S -c pass", "bare python -c pass", "monarch run -- true (2 hosts)",
                 "monarch run -- true (in-process: MONARCH_WARM_RUN=0)"):
        assert out["results"][name]["p50_ms"] > 0
    assert len(out["load"]["before"]) == 3
    steps = [s["step"] for s in out["timeline"]]
    assert steps[0] == "process started (Popen)" and steps[-1] == "process exited (the benchmark saw it)"
    assert any(s.startswith("host0: RunCommand in") for s in steps) and "RunExited of rank 1 here" in steps
    assert any(s["step"].startswith("host1: rank 1 exited") for s in out["warm_timeline"])
