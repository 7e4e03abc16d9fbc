"""``monarch_telemetry.host.warm``: the local launcher's pre-fork scan of every table."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_warm_scans_every_table_and_leaves_no_thread_to_lose_in_a_fork():
    # A fresh interpreter: what warm() imports and starts is all its own.
    code = (
        "import sys, threading\n"
        "from monarch_telemetry.host import warm\n"
        "warm()\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "assert 'psutil' in sys.modules\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_warmed_host_still_answers_with_its_own_rows():
    from monarch_telemetry.host import HostTelemetry, warm
    from monarch_telemetry.table import from_ipc

    warm()
    t = HostTelemetry("h7", 7)
    try:
        t.rank_started("r1", 0, ["true"], None)
        t.rank_ended("r1", 0, 0, "exited")
        out = t.scan({"run_ranks": 'SELECT * FROM "run_ranks"', "hosts": 'SELECT * FROM "hosts"'}, 10.0)
        ranks = from_ipc(out["run_ranks"]).to_pylist()
        assert [(r["run_id"], r["host"]) for r in ranks] == [("r1", "h7")]
        assert from_ipc(out["hosts"]).column("host").to_pylist() == ["h7"]
    finally:
        t.close()
