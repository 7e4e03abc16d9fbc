"""Smoke test: benchmarks/cold_start_bench.py runs one round and reports every variant and phase.

No thresholds: only that each variant ran and produced numbers (torchmonarch where installed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "cold_start_bench.py")


def test_cold_start_bench_one_round() -> None:
    p = subprocess.run([sys.executable, SCRIPT, "--reps", "1", "--json", "--torchmonarch-python", ""], cwd=REPO,
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    out = json.loads(p.stdout)
    for name in ("python -c pass", "monarch, own agent", "monarch, shared agent"):
        assert out["variants"][name]["first_reply_ms"] > 0
    for name in ("monarch, own agent", "monarch, shared agent"):
        timeline = out["variants"][name]["timeline_ms"]
        assert list(timeline) == ["launch", "start", "import", "this_host", "spawn_procs", "spawn", "first_reply"]
    assert "timeline of the first call" in p.stderr
