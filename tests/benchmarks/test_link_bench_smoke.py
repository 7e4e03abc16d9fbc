"""Smoke test: benchmarks/link_bench.py measures the cipher, a veth pair, ZeroMQ over it and monarch's
echo to a --netns host at a small size, and leaves no namespace behind.  No thresholds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "link_bench.py")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {ln.split()[0] for ln in out.splitlines() if ln.strip()}


@pytest.mark.timeout(600)
def test_link_bench_small_runs_and_reports() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("link_bench needs root and iproute2")
    before = _namespaces()
    p = subprocess.run([sys.executable, SCRIPT, "--mib", "2", "--reps", "1", "--json"], cwd=REPO,
                       capture_output=True, text=True, timeout=580, env={**os.environ, "PYTHONPATH": REPO})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    for section, keys in {"cipher": ["encrypt_cpu_MBps", "decrypt_cpu_MBps", "aead_encrypt_cpu_MBps", "aead_decrypt_cpu_MBps"],
                          "link": ["veth_tcp_MBps", "zmq_plain_MBps", "zmq_curve_MBps"],
                          "monarch_curve_only": ["echo_MBps"],
                          "monarch": ["echo_MBps"]}.items():
        for k in keys:
            assert out[section][k] > 0, (section, k)
    assert out["on_paper_100Gbps"]["streams"] >= 1 and out["link"]["veth_MB_per_cpu_s"] > 0
    assert not {n for n in _namespaces() - before if n.startswith("lb-")}  # (others' may come and go)
