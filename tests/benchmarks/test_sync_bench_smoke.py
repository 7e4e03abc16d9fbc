"""Smoke test: benchmarks/sync_bench.py runs end to end at a small size and reports every figure.

No thresholds: the numbers depend on the machine; this checks that each measurement ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from monarch_rdmafs.mount import fuse_unavailable_reason

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "sync_bench.py")


@pytest.mark.timeout(300)
def test_sync_bench_small_runs_and_reports(tmp_path):
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed (scripts/install.sh installs it)")
    why = fuse_unavailable_reason()
    r = subprocess.run([sys.executable, SCRIPT, "--size", "4M", "--files", "200", "--hosts", "2", "--edits", "1",
                        "--json"], capture_output=True, text=True, timeout=280, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["workspace"]["files"] == 205
    assert out["initial_sync"]["mode"] == ("materialized" if why else "fuse")
    for section, keys in {"initial_sync": ["monarch_s", "rsync_s", "ratio", "monarch_cpu_s", "rsync_cpu_s"],
                          "edit_visible": ["monarch_sync_s", "monarch_watch_s", "rsync_s"],
                          "read_MBps": ["local_disk", "mount_first", "mount_again"]}.items():
        for k in keys:
            assert out[section][k] > 0, (section, k)
