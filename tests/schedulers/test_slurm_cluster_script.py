"""scripts/slurm_cluster.sh's unhappy path: a start that fails halfway, after the namespaces,
the bridge and every daemon exist, leaves none of them behind (the session's cluster, in
conftest.py, checks the same of a normal stop).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import psutil
import pytest

from monarch_schedulers import netns
from tests.schedulers.conftest import NO_NETNS, SCRIPT, _free_ports

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0, reason="the Slurm cluster needs root"),
              pytest.mark.skipif(bool(NO_NETNS), reason=NO_NETNS or "-")]

PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"


def _daemons_of(cluster_dir: str) -> list[str]:
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and cluster_dir in " ".join(p.info["cmdline"] or []):
                out.append(f"{p.pid} {p.info['name']}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def test_failed_start_removes_namespaces_bridge_and_daemons(tmp_path):
    real = shutil.which("slurmd", path=PATH)
    if real is None:
        pytest.skip("slurmd is not installed (the session's cluster fixture installs it)")
    # The fault: the last node's slurmd does not start (the others, and slurmctld, do).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "slurmd").write_text(f'#!/bin/sh\ncase " $* " in *" -N n4 "*) echo "n4: injected failure" >&2; exit 1;; esac\n'
                                    f'exec {real} "$@"\n')
    (bin_dir / "slurmd").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MONARCH_TEST_SESSION", "SLURM_CONF")}
    env.update(PATH=f"{bin_dir}:{PATH}", MONARCH_SLURMCTLD_PORT=str(_free_ports(1)[0]),
               MONARCH_SLURMD_PORT=str(_free_ports(1)[0]),
               MONARCH_SLURM_NODE_PORT=str(_free_ports(4, consecutive=True)[0]))
    cluster_dir = str(tmp_path / "cluster")
    try:
        r = subprocess.run([SCRIPT, "start", cluster_dir], env=env, capture_output=True, text=True, timeout=90)
        assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
        assert "n4: injected failure" in r.stderr
        assert "slurm_cluster: error: slurmd -N n4 failed to start in its namespace" in r.stderr, r.stderr
        # It got as far as the namespaces and three nodes' daemons ...
        with open(os.path.join(cluster_dir, "netns.json")) as f:
            plan = netns.NetnsPlan.from_json(json.load(f))
        conf = open(os.path.join(cluster_dir, "slurm.conf")).read()
        assert f"({plan.bridge_ip})" in conf and all(f"NodeAddr={h.ip} " in conf for h in plan.hosts)
        assert os.path.exists(os.path.join(cluster_dir, "log", "slurmd-n3.log"))
        # ... and took all of it down again.
        assert netns.left_by(plan.tag) == []
        assert _daemons_of(cluster_dir) == []
    finally:
        # Stopping what is already gone is harmless (and cleans up if the assertions above failed).
        r = subprocess.run([SCRIPT, "stop", cluster_dir], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
