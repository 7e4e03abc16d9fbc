"""Smoke test: benchmarks/actor_bench.py --quick --json runs (ours only) and reports every measurement.

No thresholds: the numbers depend on the machine; this only checks that each
measurement ran and produced a number.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "actor_bench.py")

EXPECTED_KEYS = [
    "call_one_p50_us",
    "call_one_p99_us",
    "call_2_p50_us",
    "call_4_p50_us",
    "call_8_p50_us",
    "throughput_msg_s",
    *[f"{kind}_echo_{size}_MBps" for kind in ("bytes", "tensor") for size in ("1KiB", "1MiB", "16MiB", "64MiB")],
    "spawn_1_ms",
    "spawn_2_ms",
    "spawn_4_ms",
    "spawn_8_ms",
    "cold_start_ms",
    "death_detect_ms",
]


def test_actor_bench_quick_json() -> None:
    p = subprocess.run([sys.executable, SCRIPT, "--quick", "--json", "--impl", "monarch"], cwd=REPO,
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, f"exit {p.returncode}\nstderr:\n{p.stderr[-4000:]}"
    out = json.loads(p.stdout)
    assert out["impl"] == "monarch"
    results = out["results"]
    missing = [k for k in EXPECTED_KEYS if k not in results]
    assert not missing, f"missing keys {missing}"
    bad = {k: results[k] for k in EXPECTED_KEYS
           if not isinstance(results[k], (int, float)) or isinstance(results[k], bool) or not math.isfinite(results[k])}
    assert not bad, f"non-numeric results {bad}; errors: {out.get('errors')}\nstderr:\n{p.stderr[-4000:]}"
    # The machine's load during the run is reported beside the figures (they mean little without it).
    assert len(out["load_start"]) == 3 and len(out["load_end"]) == 3
    assert "load average (1 min) during each run: monarch" in p.stderr
