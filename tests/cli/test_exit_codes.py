"""Every exit code of monarch.errors.ExitCode, end to end through the real `monarch` command.

Each code is produced the way a user meets it, and with --json the error is the one document
on stdout: {"error", "hint", "exit_code"}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from monarch.errors import ExitCode
from tests.cli.conftest import MONARCH, ROOT, monarch
from tests.helpers import session_pids


def _doc(r) -> dict:
    """stdout must be exactly one JSON document."""
    return json.loads(r.stdout)


def _serve(workdir, hosts=1) -> list[int]:
    r = monarch("--json", "serve", "--hosts", str(hosts), cwd=workdir, check=True)
    return [h["pid"] for h in _doc(r)["hosts"]]


def _gone(pids, deadline_s=5.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.05)
    return False


#: Codes no command produces yet, and where they are tested meanwhile.
_NOT_FROM_A_COMMAND_YET = {ExitCode.WORKSPACE: "tests/rdmafs/test_sync_e2e.py raises WorkspaceError (no command syncs yet)"}


def test_every_code_is_tested_here():
    tested = {0, 1, 2, 3, 4, 5, 6, 130}
    assert {int(c) for c in ExitCode} == tested | {int(c) for c in _NOT_FROM_A_COMMAND_YET}


def test_lower_layers_errors_carry_the_tables_codes():
    """MonarchError, UsageError (monarch_agents) and SchedulerError (monarch_schedulers) cannot import
    the table: their codes are written as numbers there, and are the table's."""
    from monarch.errors import MonarchError, SchedulerError, UsageError

    assert (MonarchError.exit_code, UsageError.exit_code, SchedulerError.exit_code) == (
        ExitCode.FAILED, ExitCode.USAGE, ExitCode.SCHEDULER)


def test_ok_and_failed_pass_the_ranks_code_through(workdir):
    _serve(workdir)
    r = monarch("run", "--json", "--", "true", cwd=workdir)
    assert r.returncode == ExitCode.OK and _doc(r)["exit_code"] == 0
    r = monarch("run", "--json", "--", "sh", "-c", "echo on-stdout; exit 1", cwd=workdir)
    assert r.returncode == ExitCode.FAILED
    doc = _doc(r)  # the rank's output went to stderr, not into the document's stream
    assert doc["exit_code"] == 1 and "exited with code 1" in doc["error"]
    assert "[host0] on-stdout" in r.stderr


def test_usage(tmp_path):
    r = monarch("run", cwd=tmp_path)
    assert r.returncode == ExitCode.USAGE and "nothing to run" in r.stderr
    r = monarch("status", "--no-such-flag", "--json", cwd=tmp_path)
    assert r.returncode == ExitCode.USAGE
    assert _doc(r)["exit_code"] == 2 and "no-such-flag" in _doc(r)["error"]
    r = monarch("--json", "serve", "--hosts", "0", cwd=tmp_path)
    assert r.returncode == ExitCode.USAGE and _doc(r)["exit_code"] == 2


def test_state(tmp_path):
    r = monarch("run", "--json", "--", "true", cwd=tmp_path)
    assert r.returncode == ExitCode.STATE
    doc = _doc(r)
    assert doc == {"error": doc["error"], "hint": "run `monarch serve` first", "exit_code": 3}
    assert "no reservation" in doc["error"] and "Traceback" not in r.stderr


#: Holds the local hosts' launcher (a host agent process) back for a minute, so that no agent can be
#: ready within serve's --timeout however fast agents start (forked ones are up in milliseconds).
_SLOW_AGENTS = """
import os
if os.environ.get("TEST_SLOW_AGENT") and b"monarch_agents.host_agent" in open("/proc/self/cmdline", "rb").read():
    import time
    time.sleep(60)
"""


def test_scheduler_hosts_not_ready_in_time(workdir, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_AGENTS)
    before = set(session_pids())
    r = monarch("serve", "--json", "--hosts", "2", "--timeout", "1", cwd=workdir,
                env={"PYTHONPATH": f"{ROOT}:{site}", "TEST_SLOW_AGENT": "1"})
    assert r.returncode == ExitCode.SCHEDULER
    assert "not ready after" in _doc(r)["error"]
    new_agents = [p for p, cmd in session_pids().items() if p not in before and "host_agent" in cmd]
    assert _gone(new_agents)  # what it started was given back
    assert not (workdir / ".monarch" / "job_state.pkl").exists()


def test_agent_dead_or_frozen(workdir):
    pids = _serve(workdir, hosts=2)
    os.kill(pids[1], signal.SIGSTOP)
    try:
        r = monarch("run", "--", "true", cwd=workdir, timeout=60)
        assert r.returncode == ExitCode.AGENT, r.stderr
        assert "stopped answering" in r.stderr and "died" not in r.stderr  # frozen is not dead
        r = monarch("status", "--json", cwd=workdir)
        assert r.returncode == ExitCode.AGENT
        assert "frozen" in _doc(r)["error"] and _doc(r)["exit_code"] == 5
    finally:
        os.kill(pids[1], signal.SIGCONT)
    os.kill(pids[1], signal.SIGKILL)
    assert _gone([pids[1]])
    r = monarch("status", cwd=workdir)
    assert r.returncode == ExitCode.AGENT and "host1" in r.stderr and "exited" in r.stderr


def test_agent_killed_during_a_run(workdir):
    pids = _serve(workdir, hosts=2)
    p = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", "echo go; exec sleep 60"], cwd=workdir,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})
    p.stdout.readline()
    p.stdout.readline()
    os.kill(pids[1], signal.SIGKILL)
    assert p.wait(timeout=30) == ExitCode.AGENT
    assert "host1" in p.stderr.read()


def test_run_could_not_start(workdir):
    _serve(workdir)
    r = monarch("run", "--json", "-w", "/nonexistent-dir-xyz", "--", "true", cwd=workdir)
    assert r.returncode == ExitCode.RUN
    assert "/nonexistent-dir-xyz does not exist" in _doc(r)["error"]
    assert "Traceback" not in r.stderr + r.stdout


def test_interrupted_actor_program(workdir):
    _serve(workdir)
    prog = workdir / "prog.py"
    prog.write_text("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([*MONARCH, "run", str(prog)], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"},
                         start_new_session=True)
    assert p.stdout.readline().strip() == "ready"
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C at a terminal reaches the whole foreground group
    assert p.wait(timeout=20) == ExitCode.INTERRUPTED
    err = p.stderr.read()
    assert "Traceback" not in err and "interrupted" in err


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_flags_before_or_after_the_subcommand(workdir, where):
    _serve(workdir)
    args = ["--json", "--verbose", "status"] if where == "before" else ["status", "--json", "--verbose"]
    r = monarch(*args, cwd=workdir)
    assert r.returncode == 0 and _doc(r)["state"] == "RUNNING"
    # After the command to run, they are the command's own.
    r = monarch("run", "--", "echo", "--json", cwd=workdir)
    assert r.stdout.strip() == "[host0] --json"


def test_version_and_help():
    r = subprocess.run([*MONARCH, "--version"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0 and r.stdout.startswith("monarch ")
    r = subprocess.run([*MONARCH, "--help"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0
    from monarch_schedulers import names

    for sched, word in (("kubernetes", "Kubernetes"), ("slurm", "Slurm")):
        assert (word in r.stdout) == (sched in names())  # help promises exactly the schedulers there are
    for code in ExitCode:
        assert f"{int(code)}  " in r.stdout  # the table, from the one ExitCode enum
