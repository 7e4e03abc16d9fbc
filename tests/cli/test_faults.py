"""Faults of the machine end runs, never hang them (issue 25), each on a real reservation.

Each test runs the real `monarch` commands under a hard timeout and checks how the run ended (exit
code and message), that the next run works, and that memory stayed bounded (``VmRSS`` of the host
agent, from /proc).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.conftest import MONARCH, ROOT, monarch

pytestmark = pytest.mark.timeout(300)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _agent_pid(cwd) -> int:
    r = monarch("--json", "status", cwd=cwd, timeout=60, check=True)
    return json.loads(r.stdout)["hosts"][0]["pid"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs as the project folder: the job folder (and the hosts' logs) fill it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        monarch("stop", "--force", cwd=disk, timeout=60)
        subprocess.run(["umount", "-l", str(disk)], check=False)


@root_only
def test_a_full_log_disk_ends_the_run_with_its_code_and_says_the_log_is_incomplete(small_disk):
    monarch("serve", "--hosts", "1", cwd=small_disk, check=True)
    agent = _agent_pid(small_disk)
    rest = _rss_mb(agent)
    # 4 MB on one line, then a line after it, then exit 3: the log fills the disk on the way.
    script = 'head -c 4000000 /dev/zero | tr "\\0" x; echo; echo after; exit 3'
    r = monarch("run", "--", "sh", "-c", script, cwd=small_disk, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "its log is incomplete: No space left on device" in r.stderr, r.stderr
    assert "rank 0 on host0 exited with code 3" in r.stderr
    # Streaming to the client went on: every byte came through.
    assert r.stdout.count("x") == 4_000_000 and r.stdout.endswith("[host0] after\n")
    # The next run works, on the same full disk, and the history shows no run as running.
    r2 = monarch("run", "--", "echo", "next", cwd=small_disk, timeout=60)
    assert r2.returncode == 0 and r2.stdout == "[host0] next\n", r2.stderr
    listing = monarch("logs", "--list", cwd=small_disk, timeout=60, check=True).stdout
    assert "running" not in listing and "exit 3" in listing and "exit 0" in listing, listing
    assert _rss_mb(agent) < rest + 100
    # And stop gives the hosts back on the full disk too (it failed writing its note, keeping them).
    from tests.helpers import wait_gone

    r3 = monarch("stop", cwd=small_disk, timeout=60)
    assert r3.returncode == 0, r3.stderr
    assert wait_gone([agent], 30) == []


def test_a_stopped_client_makes_the_rank_wait_not_the_agent_grow(workdir):
    """A client that reads nothing (SIGSTOP) while its rank prints without end: the agent keeps at
    most its window per stream, the rank blocks on its write; once the client is killed the rank
    is stopped, the agent's memory comes back, and the next run works."""
    # The agent's telemetry keeps the last output lines by design (256 MiB of them by default): kept
    # small here, what is measured is what waits for the client.
    monarch("serve", "--hosts", "1", cwd=workdir, check=True, env={"MONARCH_TELEMETRY_BYTES": str(4 << 20)})
    agent = _agent_pid(workdir)
    # At rest: after a first run that streamed more than the window (the telemetry's Arrow is loaded).
    warm = subprocess.run([*MONARCH, "run", "--", "head", "-c", str(64 << 20), "/dev/zero"], cwd=workdir, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    assert warm.returncode == 0, warm.stderr
    rest = _rss_mb(agent)
    counter = workdir / "written"
    # The rank counts its own writes (MiB) in a file.
    script = (f"i=0; while :; do head -c 1048576 /dev/zero || exit; i=$((i+1)); echo $i > {counter}; done")
    client = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", script], cwd=workdir, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        got = 0
        while got < 64 << 20 and time.monotonic() < deadline:  # it streams: 64 MiB through the client
            got += len(client.stdout.read1(1 << 20))
        assert got >= 64 << 20
        os.kill(client.pid, signal.SIGSTOP)
        peak, written = 0.0, []
        for _ in range(30):  # 6 s stopped: unbounded, a rank writes GBs in that time
            time.sleep(0.2)
            peak = max(peak, _rss_mb(agent))
            written.append(int(counter.read_text() or 0) if counter.exists() else 0)
        # The rank is blocked: it wrote nothing in the last seconds of the stop.
        assert written[-1] == written[-10], written
        assert peak < rest + 64, (rest, peak)
        print(f"agent VmRSS: {rest:.0f} MB at rest, {peak:.0f} MB at most while the client was stopped")
        os.kill(client.pid, signal.SIGKILL)
        client.wait(30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _rss_mb(agent) < rest + 32 and not json.loads(
                monarch("--json", "status", cwd=workdir, timeout=60).stdout)["hosts"][0]["runs"]:
            break
        time.sleep(0.5)
    assert _rss_mb(agent) < rest + 32, (rest, _rss_mb(agent))
    r = monarch("run", "--", "echo", "next", cwd=workdir, timeout=60)
    assert r.returncode == 0 and r.stdout == "[host0] next\n", r.stderr


def test_the_client_prints_a_huge_line_in_pieces_and_answers_sigterm(workdir):
    """A rank printing 200 MB without a newline: the client prints it in bounded pieces as it comes,
    and a SIGTERM ends the run at once (130)."""
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    client = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", "head -c 200000000 /dev/zero | tr '\\0' a; sleep 60"],
                              cwd=workdir, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        got = 0
        while got < 50_000_000:  # pieces arrive before the line ends
            chunk = client.stdout.read1(1 << 20)
            assert chunk, client.stderr.read()
            got += len(chunk)
        client.send_signal(signal.SIGTERM)
        out, err = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    assert client.returncode == 130, err
    r = monarch("run", "--", "echo", "next", cwd=workdir, timeout=60)
    assert r.returncode == 0 and r.stdout == "[host0] next\n", r.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


_HUNG_SCRIPT = """
import time
from monarch.actor import Actor, endpoint, this_host

class Stuck(Actor):
    def __init__(self):
        while True:  # never returns: the client's call below waits for good
            time.sleep(1)

    @endpoint
    def ping(self) -> int:
        return 1

procs = this_host().spawn_procs(per_host={"gpus": 2})
stuck = procs.spawn("stuck", Stuck)
print("spawned", flush=True)
stuck.ping.call().get()
"""

_OK_SCRIPT = """
from monarch.actor import Actor, endpoint, this_host

class One(Actor):
    @endpoint
    def one(self) -> int:
        return 1

print(this_host().spawn_procs(per_host={"gpus": 1}).spawn("one", One).one.call_one().get())
"""


def _descendants(pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_hung_client_script_takes_its_agent_and_procs_with_it(tmp_path, sig):
    """An actor whose __init__ never returns hangs its client script: whatever kills the script (a
    test's timeout, kill -9), its private host agent and procs go too, and the next script works."""
    from tests.helpers import wait_gone

    script = tmp_path / "hung.py"
    script.write_text(_HUNG_SCRIPT)
    p = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"spawned\n", p.stderr.read()
        kids = _descendants(p.pid)  # the host agent, its zygote and the procs
        assert len(kids) >= 4, kids
        p.send_signal(sig)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)
    assert wait_gone(kids, 60) == []
    ok = tmp_path / "ok.py"
    ok.write_text(_OK_SCRIPT)
    r = subprocess.run([sys.executable, str(ok)], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "1\n", r.stderr


def test_a_private_agent_stops_when_its_lifeline_closes_before_any_ping(tmp_path):
    """The window before the client's first Ping (which makes the agent watch it as its owner): a
    client killed there still takes its agent with it, through the lifeline pipe."""
    from monarch_agents.keys import JobKeys
    from tests.helpers import wait_gone

    keys = JobKeys.generate()
    life_r, life_w = os.pipe()
    agent = subprocess.Popen([sys.executable, "-m", "monarch_agents.host_agent", "--ephemeral", "--lifeline-fd",
                              str(life_r), "--log-dir", str(tmp_path / "logs")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, pass_fds=(life_r,), env=_env())
    os.close(life_r)
    try:
        agent.stdin.write((json.dumps(keys.as_dict()) + "\n").encode())
        agent.stdin.close()
        assert json.loads(agent.stdout.readline())["pid"] == agent.pid  # up, and never pinged
        kids = _descendants(agent.pid)
        os.close(life_w)
        life_w = -1
        assert agent.wait(60) == 0
        assert wait_gone(kids, 30) == []
    finally:
        if life_w >= 0:
            os.close(life_w)
        if agent.poll() is None:
            agent.kill()
            agent.wait(30)


_STALL_SITECUSTOMIZE = """
import os
if os.environ.get("TEST_STALL_AGENT") and b"monarch_agents.host_agent" in open("/proc/self/cmdline", "rb").read():
    import time
    time.sleep(3600)  # the hosts' launcher is there but never forks them (stuck in an import, say)
"""

_STALL_FORKED_SITECUSTOMIZE = """
import os
if os.environ.get("TEST_STALL_AGENT") and b"monarch_agents.host_agent" in open("/proc/self/cmdline", "rb").read():
    import time

    def _hang():  # as an agent that has let go of the launcher's output, then hangs before it listens
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        time.sleep(3600)

    # The launcher forks its hosts and finishes; every host agent it forked hangs.
    os.register_at_fork(after_in_child=_hang)
"""


def test_serve_never_waits_without_end_for_agents_that_do_not_come(workdir, tmp_path):
    """Host agents that never come up: serve gives up after MONARCH_SERVE_STALL_TIMEOUT with the
    reason, stops what it started, and the next serve works.  (A 64-host serve once printed nothing
    for 300 s; the launcher of local hosts was waited for without a bound.)"""
    from monarch.errors import ExitCode
    from tests.helpers import session_pids, wait_gone

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_STALL_SITECUSTOMIZE)
    before = set(session_pids())
    r = monarch("serve", "--hosts", "2", cwd=workdir, timeout=120,
                env={"PYTHONPATH": f"{ROOT}:{site}", "TEST_STALL_AGENT": "1", "MONARCH_SERVE_STALL_TIMEOUT": "5"})
    assert r.returncode == ExitCode.SCHEDULER, r.stderr
    assert "hosts not ready after 5 s: the local host agents' launcher did not finish" in r.stderr, r.stderr
    stalled = [p for p, cmd in session_pids().items() if p not in before and "host_agent" in cmd]
    assert wait_gone(stalled, 30) == []
    assert not (workdir / ".monarch" / "job_state.pkl").exists()
    monarch("serve", "--hosts", "1", cwd=workdir, check=True, timeout=120)
    r = monarch("run", "--", "echo", "next", cwd=workdir, timeout=60)
    assert r.returncode == 0 and r.stdout == "[host0] next\n", r.stderr


def test_sigterm_ends_a_run_whose_agent_no_longer_answers(workdir):
    """The client stopped by SIGTERM while its host agent is frozen (SIGSTOP: its connection stays
    open, nothing answers): it gives the ranks up within seconds instead of waiting for their ends
    for good, and once the agent runs again the next run works."""
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    agent = _agent_pid(workdir)
    client = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", "echo started; sleep 120"], cwd=workdir, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert client.stdout.readline() == b"[host0] started\n"
        os.kill(agent, signal.SIGSTOP)
        try:
            client.send_signal(signal.SIGTERM)
            out, err = client.communicate(timeout=60)
        finally:
            os.kill(agent, signal.SIGCONT)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    assert client.returncode == 130, err
    r = monarch("run", "--", "echo", "next", cwd=workdir, timeout=60)
    assert r.returncode == 0 and r.stdout == "[host0] next\n", r.stderr


def test_serve_gives_up_on_started_agents_that_never_come_up(workdir, tmp_path):
    """The other wait: the job runs and its agents' processes are there, but none ever says where it
    listens.  serve gives up after MONARCH_SERVE_STALL_TIMEOUT naming the hosts, and releases them.
    The launcher finishes here; each agent it forked (in its host's namespaces) stalls at once."""
    from monarch.errors import ExitCode
    from monarch_schedulers import netns
    from tests.helpers import session_pids, wait_gone

    if netns.unavailable():
        pytest.skip(netns.unavailable())
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_STALL_FORKED_SITECUSTOMIZE)
    before = set(session_pids())
    r = monarch("serve", "--hosts", "2", "--netns", cwd=workdir, timeout=120,
                env={"PYTHONPATH": f"{ROOT}:{site}", "TEST_STALL_AGENT": "1", "MONARCH_SERVE_STALL_TIMEOUT": "5"})
    assert r.returncode == ExitCode.SCHEDULER, r.stderr
    assert "no new host agent came up in 5 s" in r.stderr and "0/2 up, none yet on host0, host1" in r.stderr, r.stderr
    stalled = [p for p, cmd in session_pids().items() if p not in before and "host_agent" in cmd]
    assert wait_gone(stalled, 30) == []
    assert not (workdir / ".monarch" / "job_state.pkl").exists()


_PROGRAM = """
import signal, sys, time
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # hung, and deaf to the first SIGTERM
    print("up", flush=True)
    time.sleep(600)
sys.stdout.write("p" * 1_000_000 + "\\n")
print("done")
"""


@root_only
def test_an_actor_program_on_a_full_disk_runs_to_its_end(small_disk):
    """`monarch run prog.py` keeps the program's output in the job folder: a full disk ends that
    log (saying so), not the program, whose output still reaches the terminal."""
    monarch("serve", "--hosts", "1", cwd=small_disk, check=True)
    prog = small_disk / "prog.py"
    prog.write_text(_PROGRAM)
    with open(small_disk / "filler", "wb") as f:  # the disk full before the program starts
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    r = monarch("run", str(prog), cwd=small_disk, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("p") == 1_000_000 and r.stdout.endswith("done\n")
    assert "warning: the program's" in r.stderr and "No space left on device" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_second_sigterm_kills_a_program_deaf_to_the_first(workdir):
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    prog = workdir / "prog.py"
    prog.write_text(_PROGRAM)
    client = subprocess.Popen([*MONARCH, "run", str(prog), "--ignore-term"], cwd=workdir, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert client.stdout.readline() == b"up\n"
        client.send_signal(signal.SIGTERM)
        time.sleep(1)
        assert client.poll() is None  # the program ignored it; so does the run, waiting for it
        client.send_signal(signal.SIGTERM)
        out, err = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    assert client.returncode == 130, err


def test_a_killed_monarch_run_takes_its_program_with_it(workdir):
    """`monarch run prog.py` killed with -9 (a test's timeout, an OOM kill): the program it started,
    hung and deaf to SIGTERM, goes too (it watches a pipe only that client holds)."""
    from tests.helpers import wait_gone

    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    prog = workdir / "prog.py"
    prog.write_text(_PROGRAM)
    client = subprocess.Popen([*MONARCH, "run", str(prog), "--ignore-term"], cwd=workdir, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert client.stdout.readline() == b"up\n"
        program = _descendants(client.pid)
        assert program, "no program process"
        client.kill()
        client.wait(30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    assert wait_gone(program, 30) == []
    r = monarch("run", "--", "echo", "next", cwd=workdir, timeout=60)
    assert r.returncode == 0 and r.stdout == "[host0] next\n", r.stderr


@root_only
def test_serve_on_a_full_disk_is_one_line_and_leaves_nothing(small_disk):
    """The job's files cannot be written: one line naming the file and how to look, exit 1 at once,
    no half-made job folder, no state file, no agent started."""
    from tests.helpers import session_pids

    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)
    before = set(session_pids())
    r = monarch("serve", "--hosts", "1", cwd=small_disk, timeout=60)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: No space left on device writing ") and "keys.json" in lines[0], r.stderr
    assert "df -h" in lines[1] and len(lines) == 2 and "Traceback" not in r.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    assert [c for p, c in session_pids().items() if p not in before and "host_agent" in c] == []
