"""`monarch serve --workspace`, `monarch run` in the synced workspace, `monarch sync [--watch]`, status, stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from monarch_rdmafs.mount import SUBTYPE, fuse_unavailable_reason
from tests.cli.conftest import MONARCH, ROOT, monarch

pytestmark = pytest.mark.timeout(240)


def _rdmafs_mounts() -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[2] == f"fuse.{SUBTYPE}"]


@pytest.fixture
def fuse_ok():
    why = fuse_unavailable_reason()
    if why:
        pytest.skip(f"FUSE cannot be used here: {why}")


def _project(workdir) -> None:
    (workdir / "pkg").mkdir()
    (workdir / "pkg" / "__init__.py").write_text("VERSION = 1\n")
    (workdir / "sub").mkdir()
    (workdir / "sub" / "show.py").write_text(
        "import os, pkg\nprint('cwd', os.getcwd()); print('version', pkg.VERSION)\n")
    (workdir / ".gitignore").write_text("*.tmp\n")
    (workdir / "scratch.tmp").write_text("ignored\n")


def test_workspace_is_mounted_everywhere_runs_start_in_it_and_run_pushes_changes(workdir, fuse_ok):
    _project(workdir)
    r = monarch("--json", "serve", "--hosts", "2", "--workspace", ".", cwd=workdir)
    assert r.returncode == 0, r.stderr
    served = json.loads(r.stdout)
    mounts = served["workspace"]["mounts"]
    assert set(mounts) == {"host0", "host1"} and len(set(mounts.values())) == 2
    for mnt in mounts.values():
        assert sorted(os.listdir(mnt)) == [".gitignore", "pkg", "sub"]
        with pytest.raises(OSError):
            open(os.path.join(mnt, "pkg", "__init__.py"), "w")
    # A run from a sub-folder starts at the same place in each host's mount, with the mount on PYTHONPATH.
    r = monarch("run", "--", sys.executable, "show.py", cwd=workdir / "sub")
    assert r.returncode == 0, r.stderr
    for host, mnt in mounts.items():
        assert f"[{host}] cwd {os.path.join(mnt, 'sub')}" in r.stdout
    assert r.stdout.count("version 1") == 2
    # An edit is pushed by the next run, before it starts.
    (workdir / "pkg" / "__init__.py").write_text("VERSION = 2\n")
    r = monarch("run", "--", sys.executable, "sub/show.py", cwd=workdir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("version 2") == 2 and "synced to 2 hosts" in r.stderr
    # Nothing changed: the run says nothing about the workspace.
    r = monarch("run", "--", "true", cwd=workdir)
    assert r.returncode == 0 and "synced" not in r.stderr
    # monarch sync, and status.
    (workdir / "pkg" / "new.py").write_text("X = 1\n")
    r = monarch("--json", "sync", cwd=workdir)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)[0]
    assert res["changed"] and res["files"] == 4 and res["sent_chunks"] == 2 and res["transport"] == "tcp"
    r = monarch("--json", "status", cwd=workdir)
    st = json.loads(r.stdout)
    for h in st["hosts"]:
        ws = h["workspace"]
        assert ws["transport"] == "tcp" and ws["transport_reason"]
        (mt,) = ws["mounts"]
        assert mt["files"] == 4 and mt["mode"] == "fuse" and mt["mountpoint"] == mounts[h["host"]]
        assert time.time() - mt["synced_at"] < 120
    r = monarch("status", cwd=workdir, env={"COLUMNS": "250"})
    assert "last sync" in r.stdout and mounts["host0"] in r.stdout
    # Stop leaves no mount behind.
    assert monarch("stop", cwd=workdir).returncode == 0
    # Ours only: tests of other sessions on this machine may hold mounts of their own meanwhile.
    assert not set(_rdmafs_mounts()) & set(mounts.values())
    for mnt in mounts.values():
        assert not os.path.exists(mnt)


def test_stop_removes_the_store_of_a_host_agent_killed_with_sigkill(workdir):
    _project(workdir)
    r = monarch("--json", "serve", "--hosts", "2", "--workspace", ".", cwd=workdir, check=True)
    served = json.loads(r.stdout)
    pids = [h["pid"] for h in served["hosts"]]
    # <temp dir>/monarch-<uid>/ws-<tag>/mnt/workspace: the store and mounts of each host live in its ws-<tag>.
    roots = [os.path.dirname(os.path.dirname(m)) for m in served["workspace"]["mounts"].values()]
    assert len(set(roots)) == 2 and all(os.path.isdir(os.path.join(r, "store")) for r in roots)
    os.kill(pids[1], signal.SIGKILL)  # it cannot remove its store now
    while psutil.pid_exists(pids[1]) and psutil.Process(pids[1]).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.02)
    assert monarch("stop", cwd=workdir).returncode == 0
    assert [r for r in roots if os.path.exists(r)] == []
    assert [m for m in _rdmafs_mounts() if any(m.startswith(r + os.sep) for r in roots)] == []


def test_mounts_are_forks_of_each_hosts_zygote_and_unmount_when_their_agent_is_killed(workdir, fuse_ok):
    _project(workdir)
    served = json.loads(monarch("--json", "serve", "--hosts", "2", "--workspace", ".", cwd=workdir, check=True).stdout)
    mounts = served["workspace"]["mounts"]
    try:
        for h in served["hosts"]:
            agent = psutil.Process(h["pid"])
            [zygote] = agent.children()
            [mount] = zygote.children()
            # A fork of the warm zygote (FUSE imported once, by the launcher), not an interpreter of its own.
            assert mount.cmdline() == agent.cmdline() and mount.pid != zygote.pid
            assert mounts[h["host"]] in _rdmafs_mounts()
        # A mount process killed with -9: its agent hears it from the zygote and forks another.
        zygote = psutil.Process(served["hosts"][0]["pid"]).children()[0]
        [first] = zygote.children()
        first.kill()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            again = [c for c in zygote.children() if c.pid != first.pid]
            if again and mounts["host0"] in _rdmafs_mounts():
                try:
                    if sorted(os.listdir(mounts["host0"])) == [".gitignore", "pkg", "sub"]:
                        break
                except OSError:
                    pass  # the dead mount, not yet replaced
            time.sleep(0.1)
        else:
            raise AssertionError("the killed mount process was not replaced")
        # The agent killed: its zygote tells the mount to end (not SIGKILL), and it unmounts itself.
        victim = served["hosts"][1]
        mount = psutil.Process(victim["pid"]).children()[0].children()[0]
        os.kill(victim["pid"], signal.SIGKILL)
        mount.wait(30)
        assert mounts[victim["host"]] not in _rdmafs_mounts()
    finally:
        assert monarch("stop", cwd=workdir).returncode == 0
    assert not set(_rdmafs_mounts()) & set(mounts.values())


def test_env_dir_is_synced_beside_and_leads_path(workdir, fuse_ok):
    _project(workdir)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(workdir / ".venv")], check=True)
    (workdir / ".gitignore").write_text(".venv/\n")
    r = monarch("serve", "--workspace", ".", "--env-dir", ".venv", cwd=workdir)
    assert r.returncode == 0, r.stderr
    r = monarch("run", "--", "sh", "-c", 'echo "venv=$VIRTUAL_ENV"; python -c "import sys; print(\'prefix\', sys.prefix)"',
                cwd=workdir)
    assert r.returncode == 0, r.stderr
    venv = r.stdout.split("venv=")[1].split()[0]
    assert venv.endswith("/mnt/env") and f"prefix {venv}" in r.stdout
    assert not os.path.exists(os.path.join(venv.replace("/mnt/env", "/mnt/workspace"), ".venv"))


def test_watch_pushes_every_save(workdir, fuse_ok):
    _project(workdir)
    r = monarch("--json", "serve", "--hosts", "2", "--workspace", ".", cwd=workdir)
    assert r.returncode == 0, r.stderr
    mounts = list(json.loads(r.stdout)["workspace"]["mounts"].values())
    watcher = subprocess.Popen([*MONARCH, "sync", "--watch"], cwd=workdir, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})
    try:
        while "watching" not in watcher.stderr.readline():
            assert watcher.poll() is None
        for n in (2, 3):
            (workdir / "pkg" / "__init__.py").write_text(f"VERSION = {n}\n")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if all(open(os.path.join(m, "pkg", "__init__.py")).read() == f"VERSION = {n}\n" for m in mounts):
                    break
                time.sleep(0.01)
            else:
                pytest.fail(f"edit {n} never reached every host")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=20) == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()


def test_bad_workspace_paths_are_one_line_and_reserve_nothing(workdir):
    r = monarch("serve", "--workspace", "nope", cwd=workdir)
    assert r.returncode == 7 and "workspace nope does not exist" in r.stderr and "Traceback" not in r.stderr
    assert not (workdir / ".monarch" / "job_state.pkl").exists()
    (workdir / "f").write_text("x")
    r = monarch("serve", "--workspace", "f", cwd=workdir)
    assert r.returncode == 7 and "is not a folder" in r.stderr
    r = monarch("serve", "--env-dir", ".venv", cwd=workdir)
    assert r.returncode == 2 and "--env-dir goes with --workspace" in r.stderr
    assert monarch("serve", cwd=workdir).returncode == 0
    r = monarch("sync", cwd=workdir)
    assert r.returncode == 2 and "no workspace" in r.stderr and "monarch sync --workspace ." in r.stderr
