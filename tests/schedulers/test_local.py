"""The local scheduler on its own: what its state file records and what ``release`` signals."""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil

from monarch_agents.keys import JobKeys
from monarch_schedulers.agent_launch import write_keys
from monarch_schedulers.base import HostState
from monarch_schedulers.local import LocalScheduler
from tests.helpers import wait_gone


def _allocate(job_dir, hosts=1):
    s = LocalScheduler()
    req = s.dryrun(SimpleNamespace(hosts=hosts, options={}), str(job_dir))
    write_keys(str(job_dir), JobKeys.generate())
    return s, s.allocate(req)


def test_state_file_records_pid_and_start_time_privately(tmp_path):
    s, job_id = _allocate(tmp_path)
    try:
        data = json.loads((tmp_path / "local.json").read_text())
        [agent] = data["agents"]
        assert agent["started"] == psutil.Process(agent["pid"]).create_time()
        assert oct(os.stat(tmp_path / "local.json").st_mode & 0o777) == "0o600"
    finally:
        s.release(job_id, str(tmp_path))
    assert s.describe(job_id, str(tmp_path)).state is HostState.ENDED


def test_release_never_signals_a_process_that_reused_an_agent_pid(tmp_path):
    """The state file names a pid that now belongs to someone else (reboot, wrap-around)."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        # As the scheduler wrote it when "its" agent had this pid: same number, earlier start.
        earlier = psutil.Process(stranger.pid).create_time() - 3600
        (tmp_path / "local.json").write_text(json.dumps(
            {"job_id": "local-reused", "agents": [{"pid": stranger.pid, "started": earlier}]}))
        s = LocalScheduler()
        d = s.describe("local-reused", str(tmp_path))
        assert d.state is HostState.ENDED, d
        s.release("local-reused", str(tmp_path))
        time.sleep(0.2)
        assert stranger.poll() is None, "release signalled a process that only shares the agent's pid"
    finally:
        stranger.send_signal(signal.SIGKILL)
        stranger.wait()


def test_release_stops_the_agent_it_started(tmp_path):
    s, job_id = _allocate(tmp_path, hosts=2)
    pids = [a["pid"] for a in json.loads((tmp_path / "local.json").read_text())["agents"]]
    assert s.describe(job_id, str(tmp_path)).state is HostState.RUNNING
    s.release(job_id, str(tmp_path))
    # release returns once each agent is exiting (the kernel may still be tearing it down): gone soon after.
    left = wait_gone(pids)
    assert left == [], {p: _where(p) for p in left}  # seen once under load, not reproduced: say where it was
    s.release(job_id, str(tmp_path))  # twice is fine


def _where(pid: int) -> str:
    """What /proc says a process that will not go is doing (state, flags, the kernel function it waits in)."""
    out = []
    for name in ("stat", "wchan", "status"):
        try:
            with open(f"/proc/{pid}/{name}") as f:
                text = f.read()
        except OSError as e:
            text = str(e)
        if name == "status":
            text = " ".join(ln for ln in text.splitlines() if ln.split(":")[0] in ("State", "Threads", "PPid"))
        out.append(f"{name}: {text.strip()}")
    return "; ".join(out)


def test_agents_are_forks_of_one_launcher_each_in_its_own_session_with_its_zygote(tmp_path):
    s, job_id = _allocate(tmp_path, hosts=3)
    try:
        pids = [a["pid"] for a in json.loads((tmp_path / "local.json").read_text())["agents"]]
        assert len(set(pids)) == 3
        for pid in pids:
            assert os.getsid(pid) == pid  # outlives `monarch serve`: a session of its own
            deadline = time.monotonic() + 30
            while not psutil.Process(pid).children() and time.monotonic() < deadline:
                time.sleep(0.05)
            [zygote] = psutil.Process(pid).children()  # forked, not a new interpreter
            assert zygote.cmdline() == psutil.Process(pid).cmdline()
        assert (tmp_path / "logs" / "launcher.log").exists()
        # The launcher answered a scan of every table before it forked (the first query's set-up, shared).
        assert "could not" not in (tmp_path / "logs" / "launcher.log").read_text()
        assert oct(os.stat(tmp_path / "fork-hosts.json").st_mode & 0o777) == "0o600"
    finally:
        s.release(job_id, str(tmp_path))
    assert wait_gone(pids) == []


def test_a_released_reservation_says_so_to_describe(tmp_path):
    s, job_id = _allocate(tmp_path, hosts=2)
    s.release(job_id, str(tmp_path))
    d = s.describe(job_id, str(tmp_path))
    assert d.state is HostState.ENDED and "released" in d.reason


def test_logs_read_a_rotated_agent_log_oldest_first(tmp_path):
    """A capped agent.log (monarch_agents.logcap.StdioLogCap) that rotated: agent.log.1, then agent.log."""
    from monarch_schedulers.local import LocalScheduler

    for i in (0, 1):
        (tmp_path / "logs" / f"host{i}").mkdir(parents=True)
        (tmp_path / "logs" / f"host{i}" / "agent.log").write_text(f"agent {i} now\n")
    (tmp_path / "logs" / "host1" / "agent.log.1").write_text("agent 1 before\n")
    text = LocalScheduler().logs("nojob", job_dir=str(tmp_path))
    assert text == "== host0 ==\nagent 0 now\n\n== host1 ==\nagent 1 before\nagent 1 now\n"
