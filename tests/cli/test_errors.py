"""Bad input: one line, the fixing command, the documented exit code, nothing left behind."""

import os
import pickle

from tests.cli.conftest import monarch


def test_no_reservation(tmp_path):
    r = monarch("run", "--", "true", cwd=tmp_path)
    assert r.returncode == 3
    assert "no reservation" in r.stderr and "monarch serve" in r.stderr
    assert "Traceback" not in r.stderr


def test_corrupt_and_truncated_state(tmp_path):
    d = tmp_path / ".monarch"
    d.mkdir()
    (d / "job_state.pkl").write_bytes(b"\x80\x05garbage")
    r = monarch("status", cwd=tmp_path)
    assert r.returncode == 3 and "corrupt" in r.stderr
    r = monarch("stop", cwd=tmp_path)
    assert r.returncode == 3
    r = monarch("stop", "--force", cwd=tmp_path)
    assert r.returncode == 0 and not (d / "job_state.pkl").exists()


def test_other_version_state(tmp_path):
    d = tmp_path / ".monarch"
    d.mkdir()
    (d / "job_state.pkl").write_bytes(pickle.dumps({"format": "monarch-job-state", "version": 99, "state": {}}))
    r = monarch("run", "--", "true", cwd=tmp_path)
    assert r.returncode == 3 and "version 99" in r.stderr


def test_dead_allocation(tmp_path):
    r = monarch("--json", "serve", cwd=tmp_path)
    assert r.returncode == 0
    import json
    import signal

    for h in json.loads(r.stdout)["hosts"]:
        os.kill(h["pid"], signal.SIGKILL)
    import time

    time.sleep(0.2)  # the kernel reaps the killed agent; nothing to await from here
    r = monarch("run", "--", "true", cwd=tmp_path)
    assert r.returncode == 3 and "is gone" in r.stderr and "monarch serve" in r.stderr
    assert monarch("stop", cwd=tmp_path).returncode == 0


def test_usage_errors(tmp_path):
    r = monarch("serve", "--scheduler", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "unknown scheduler" in r.stderr
    r = monarch("serve", "--partition", "x", cwd=tmp_path)
    assert r.returncode == 2 and "--scheduler slurm" in r.stderr
    r = monarch("version", cwd=tmp_path)
    assert r.returncode == 0 and "monarch" in r.stdout


def test_reservation_found_from_a_sub_directory(workdir):
    # As git finds its repository: `cd examples && monarch run` uses the reservation served above.
    monarch("serve", cwd=workdir, check=True)
    sub = workdir / "a" / "b"
    sub.mkdir(parents=True)
    r = monarch("run", "--", "pwd", cwd=sub, check=True)
    assert r.stdout.strip().endswith(str(sub))  # the command runs where the user stands
    assert monarch("status", cwd=sub).returncode == 0
    assert not (sub / ".monarch").exists()
    r = monarch("--json", "serve", cwd=sub, check=True)  # reuses it, does not make a second one
    import json

    assert json.loads(r.stdout)["reused"] is True
