"""Smoke test: benchmarks/scale_bench.py runs end to end at 2 hosts and reports every figure.

No thresholds: the numbers depend on the machine and its load; this checks that each measurement ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "scale_bench.py")


@pytest.mark.timeout(300)
def test_scale_bench_two_hosts_reports_every_figure(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, "--hosts", "2", "--repeat", "1", "--idle-s", "0.5", "--json", "--direct"],
                       capture_output=True, text=True, timeout=280, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 0, r.stderr
    (size,) = json.loads(r.stdout)["sizes"]
    assert size["hosts"] == 2
    for figure in ("serve", "run", "fail", "status", "query_first", "query", "sync", "stop"):
        assert size[figure] > 0, figure
    for when in ("footprint_idle", "footprint_used"):
        assert size[when]["pss"] > 0 and size[when]["rss"] > 0, when
        assert size[when]["idle_cpu_pct_per_host"] >= 0
    assert size["proc_footprint"]["rss"] > 0
    for figure in ("run", "status", "query"):
        for how in ("tree", "direct"):
            assert size["tree_vs_direct"][f"{figure}_{how}"] > 0 and size["tree_vs_direct"][f"{figure}_{how}_cpu"] > 0
