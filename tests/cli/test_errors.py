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


def _agent_pids(workdir, **kw):
    import json

    r = monarch("--json", "serve", cwd=workdir, check=True, **kw)
    return [h["pid"] for h in json.loads(r.stdout)["hosts"]]


def _gone(pids, deadline_s=5.0):
    import time

    import psutil

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.05)
    return False


def test_stop_force_stops_agents_of_an_unreadable_state_file(workdir):
    for lose_record in (False, True):
        pids = _agent_pids(workdir)
        state = workdir / ".monarch" / "job_state.pkl"
        state.write_bytes(b"\x80\x05garbage")
        if lose_record:  # not even the scheduler's record: the agents are found by their arguments
            (workdir / ".monarch" / "jobs" / "default" / "local.json").unlink()
        r = monarch("stop", cwd=workdir)
        assert r.returncode == 3 and "corrupt" in r.stderr and not _gone(pids, 0.2)
        r = monarch("stop", "--force", cwd=workdir)
        assert r.returncode == 0, r.stderr
        assert ("stopped host agent pid" if lose_record else "released local job") in r.stderr
        assert _gone(pids), f"agents {pids} still run after stop --force"
        assert not state.exists()


def test_loose_state_file_mode_is_fixed_with_a_warning(workdir):
    _agent_pids(workdir)
    state = workdir / ".monarch" / "job_state.pkl"
    os.chmod(state, 0o644)
    r = monarch("status", cwd=workdir)
    assert r.returncode == 0
    assert "warning:" in r.stderr and "readable by others" in r.stderr
    assert oct(os.stat(state).st_mode & 0o777) == "0o600"
    assert "warning" not in monarch("status", cwd=workdir).stderr  # once fixed, quiet


def test_messages_name_the_other_reservations_and_the_switch(workdir):
    _agent_pids(workdir)
    monarch("serve", "--name", "other", cwd=workdir, check=True)
    monarch("stop", cwd=workdir, check=True)  # stops 'other', the current one
    for args in (["status"], ["run", "--", "true"]):
        r = monarch(*args, cwd=workdir)
        assert r.returncode == 3
        assert "'default'" in r.stderr and "monarch context use default" in r.stderr
    r = monarch("stop", cwd=workdir)
    assert r.returncode == 0 and "nothing to stop" in r.stderr and "monarch context use default" in r.stderr
    monarch("context", "use", "default", cwd=workdir, check=True)
    assert monarch("status", cwd=workdir).returncode == 0


def test_piped_status_keeps_whole_addresses(workdir):
    import json

    r = monarch("--json", "serve", "--hosts", "2", cwd=workdir, check=True)
    addrs = [h["addr"] for h in json.loads(r.stdout)["hosts"]]
    r = monarch("status", cwd=workdir, check=True)  # stdout is a pipe here
    for a in addrs:
        assert a in r.stdout
    assert "┃" not in r.stdout  # plain columns for grep and awk


def test_run_imports_only_what_it_uses(workdir):
    # Lazy command loading and lazy Rich: `monarch run` loads its own module, not the others', and
    # no Rich when it has nothing to draw; a plain run line takes the lean path (no Click), and a
    # local reservation's hosts are reached over Unix sockets only (no pyzmq).
    import subprocess
    import sys

    from tests.cli.conftest import ROOT

    _agent_pids(workdir)
    code = ("import sys\nfrom monarch_cli.main import main\n"
            "try:\n    main(['run', '--', 'true'])\nexcept SystemExit as e:\n    rc = e.code\n"
            "mods = sorted(m for m in sys.modules if m.startswith(('rich', 'monarch_cli.commands.', 'click', 'zmq')))\n"
            "print(rc, mods, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.stderr.strip().splitlines()[-1] == "0 ['monarch_cli.commands.run_core']"
    r = subprocess.run([sys.executable, "-c", code.replace("'run', '--', 'true'", "'run', '--help'")], cwd=workdir,
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert "'rich'" in r.stderr.splitlines()[-1] and "'click'" in r.stderr.splitlines()[-1]
    assert "Usage: monarch run" in r.stdout


def test_serve_replace_over_an_unreadable_state_file_stops_what_it_had_reserved(workdir):
    pids = _agent_pids(workdir)
    (workdir / ".monarch" / "job_state.pkl").write_bytes(b"\x80\x05garbage")
    assert monarch("serve", cwd=workdir).returncode == 3  # refused without --replace
    monarch("serve", "--replace", cwd=workdir, check=True)
    assert _gone(pids), "the agents of the unreadable reservation were left running"


def test_a_reservation_served_by_another_wire_version_is_one_line_not_a_hang(workdir):
    """Its agents would drop this monarch's messages unread (monarch updated since serve): every
    command that talks to them says so at once and how to fix it; stop still releases it."""
    from monarch._workbench.state import load_state, save_state
    from monarch_agents.wire import VERSION

    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    path = str(workdir / ".monarch" / "job_state.pkl")
    record = load_state(path)
    assert record.wire == VERSION
    record.wire = VERSION - 1
    save_state(path, record)
    for args in (["run", "--", "true"], ["status"], ["query", "SELECT count(*) FROM procs"]):
        r = monarch(*args, cwd=workdir, timeout=60)
        assert r.returncode != 0 and f"wire version {VERSION - 1}; this monarch speaks {VERSION}" in r.stderr, (args, r.stderr)
        assert "`monarch stop` releases it" in r.stderr and "Traceback" not in r.stderr, r.stderr
    pid = record.hosts[0].pid
    monarch("stop", cwd=workdir, check=True)
    from tests.helpers import wait_gone

    assert wait_gone([pid], 30) == []
