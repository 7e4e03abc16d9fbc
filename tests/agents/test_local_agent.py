"""The user's shared local host agent (``monarch_agents.local_agent``): real scripts, real agent.

Each test gives the agent a runtime folder of its own and stops the agent at the end, so none
outlives the test (``MONARCH_SHARED_AGENT=0`` is the suite's default; these tests turn it on).
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.helpers import ROOT, alive, wait_gone

SCRIPT = r"""
import os, sys, time
os.environ["SHARED_AGENT_TEST"] = "changed-after-start"
from monarch.actor import Actor, endpoint, this_host

class Where(Actor):
    @endpoint
    def where(self):
        print("actor-stdout", flush=True)
        print("actor-stderr", file=sys.stderr, flush=True)
        return os.getcwd(), os.environ.get("SHARED_AGENT_TEST"), os.getpid(), os.environ["MONARCH_HOST_AGENT"]

procs = this_host().spawn_procs(per_host={"gpus": 2})
answers = [v for _, v in procs.spawn("where", Where).where.call().get(timeout=60)]
print("ANSWERS", repr(answers), flush=True)
if sys.argv[1:] == ["hang"]:
    time.sleep(600)
"""


@pytest.fixture
def shared_env(tmp_path):
    # A short folder: a Unix socket's path is at most 107 bytes (a longer one means no shared agent).
    short = pathlib.Path(tempfile.mkdtemp(prefix="ma-"))
    rt_dir = short / "rt"
    env = {**os.environ, "MONARCH_SHARED_AGENT": "1", "MONARCH_RUNTIME_DIR": str(rt_dir),
           "MONARCH_AGENT_IDLE_S": "60", "SHARED_AGENT_TEST": "at-agent-start"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "prog.py").write_text(SCRIPT)
    yield env, rt_dir, tmp_path / "wd"
    for pid in _agent_pids(rt_dir):
        os.kill(pid, signal.SIGTERM)
        if wait_gone([pid], 10):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(short, ignore_errors=True)


def _agent_pids(rt_dir) -> list[int]:
    import psutil

    found = {}
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "--shared-socket" in cmd and cmd[cmd.index("--shared-socket") + 1].startswith(str(rt_dir)):
            found[p.pid] = p.info["ppid"]
    # The agents, not their zygotes (forks of them, with the same command line).
    return [pid for pid, ppid in found.items() if ppid not in found]


def _run(env, wd, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "prog.py", *args], cwd=wd, env=env, capture_output=True, text=True,
                          timeout=120, **kw)


def _answers(stdout: str) -> list:
    line = [ln for ln in stdout.splitlines() if ln.startswith("ANSWERS ")]
    assert line, stdout
    return eval(line[-1][len("ANSWERS "):])


def test_scripts_share_one_agent_and_see_their_own_cwd_env_and_stdio(shared_env):
    env, rt_dir, wd = shared_env
    first = _run(env, wd)
    assert first.returncode == 0, first.stderr
    second = _run(env, wd)
    assert second.returncode == 0, second.stderr
    a1, a2 = _answers(first.stdout), _answers(second.stdout)
    assert {a[3] for a in a1} == {a[3] for a in a2}  # the same agent answered both
    assert len(_agent_pids(rt_dir)) == 1
    for cwd, var, pid, _ in a1 + a2:
        assert cwd == str(wd)
        assert var == "changed-after-start"  # the script's environment as it is at spawn time
        assert not alive(pid)  # a script's procs end with it
    for run in (first, second):
        assert run.stdout.count("actor-stdout") == 2
        assert run.stderr.count("actor-stderr") == 2
    socks = glob.glob(str(rt_dir / "agent-*.sock"))
    assert len(socks) == 1
    assert os.stat(rt_dir).st_mode & 0o777 == 0o700


def test_a_killed_script_loses_its_procs_and_the_agent_stays(shared_env):
    env, rt_dir, wd = shared_env
    proc = subprocess.Popen([sys.executable, "prog.py", "hang"], cwd=wd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        while not line.startswith("ANSWERS "):
            line = proc.stdout.readline()
            assert line, "the script ended before its actors answered"
        pids = [a[2] for a in eval(line[len("ANSWERS "):])]
        proc.kill()
        proc.wait()
        assert wait_gone(pids, 10) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(_agent_pids(rt_dir)) == 1
    again = _run(env, wd)
    assert again.returncode == 0, again.stderr


def test_idle_agent_exits_and_removes_its_socket(shared_env):
    env, rt_dir, wd = shared_env
    env = {**env, "MONARCH_AGENT_IDLE_S": "1"}
    assert _run(env, wd).returncode == 0
    deadline = time.monotonic() + 30
    while (_agent_pids(rt_dir) or glob.glob(str(rt_dir / "agent-*.sock"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _agent_pids(rt_dir)
    assert not glob.glob(str(rt_dir / "agent-*.sock"))


def test_an_open_runtime_folder_is_not_used(shared_env):
    """Writable by others: someone could have put a socket of theirs in it (monarch_rdmafs.private's
    rule; a folder of ours only readable by others is made 0700 and used)."""
    env, rt_dir, wd = shared_env
    rt_dir.mkdir(mode=0o775)
    os.chmod(rt_dir, 0o775)
    run = _run(env, wd)
    assert run.returncode == 0, run.stderr  # a private agent of its own instead
    assert not _agent_pids(rt_dir)
    assert not glob.glob(str(rt_dir / "agent-*"))


@pytest.mark.parametrize("path", [("monarch_agents", "names.py"),
                                  ("monarch", "config.py")])  # a proc of a stale agent once ran an old one
def test_an_agent_whose_code_was_edited_is_retired_by_the_next_script(shared_env, path):
    env, rt_dir, wd = shared_env
    assert _run(env, wd).returncode == 0
    (old,) = _agent_pids(rt_dir)
    edited = os.path.join(ROOT, *path)
    st = os.stat(edited)
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # as an edit would
    try:
        run = _run(env, wd)
    finally:
        os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run.returncode == 0, run.stderr
    assert wait_gone([old], 10) == []  # retired, and idle: it exits at once
    assert len(_agent_pids(rt_dir)) == 1  # the new one


def test_the_owner_listener_stops_its_threads_by_its_deadline(tmp_path):
    """An owner connected when the agent stops: stop(deadline) wakes its thread (blocked reading the
    owner's socket) and joins it, the accept and idle threads too.  The agent here is a plain record
    of what the listener reads from it; the sockets and threads are the real ones."""
    import socket
    import threading
    from types import SimpleNamespace

    from monarch_agents.local_agent import OwnerListener

    released = []
    agent = SimpleNamespace(stopping=threading.Event(), rt=SimpleNamespace(addr="ipc://x"), host="h", children={},
                            keys=SimpleNamespace(as_dict=lambda: {}), child_env=lambda extra: {},
                            release_owner=lambda owner, wait_s: released.append(owner), request_stop=lambda: None)
    listener = OwnerListener(agent, str(tmp_path / "agent.sock"), idle_s=600)
    listener.start()
    owner = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        owner.connect(str(tmp_path / "agent.sock"))
        assert owner.recv(1 << 16)  # the hello: its thread now waits for the owner's next message
        threads = [t for t in threading.enumerate() if t.name in ("owners", "idle", "owner")]
        assert {t.name for t in threads} == {"owners", "idle", "owner"}
        agent.stopping.set()
        listener.stop(time.monotonic() + 10)
        assert [t.name for t in threads if t.is_alive()] == []
        assert not (tmp_path / "agent.sock").exists()
    finally:
        owner.close()


ENV_SCRIPT = r"""
import os, sys, time
import torch  # before this_host(): the shared agent's zygote preloads it
from monarch.actor import Actor, endpoint, this_host

class Env(Actor):
    @endpoint
    def env(self):
        import tempfile
        return (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"), time.localtime().tm_gmtoff,
                tempfile.gettempdir(), os.getppid())

procs = this_host().spawn_procs(per_host={"gpus": 1})
print("ANSWERS", repr([v for _, v in procs.spawn("env", Env).env.call().get(timeout=60)]), flush=True)
"""


def test_procs_of_later_scripts_get_their_own_environment_not_the_first_scripts(shared_env, tmp_path):
    """The shared agent's zygote imported torch under the first script's OMP_NUM_THREADS (and time
    zone, TMPDIR): procs of later scripts inherited them.  Each proc now sets them from its own."""
    pytest.importorskip("torch")
    env, rt_dir, wd = shared_env
    (wd / "envprog.py").write_text(ENV_SCRIPT)
    tmp_a, tmp_b = tmp_path / "tmp-a", tmp_path / "tmp-b"
    tmp_a.mkdir()
    tmp_b.mkdir()

    def run(**extra):
        e = {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TZ", "TMPDIR")}
        r = subprocess.run([sys.executable, "envprog.py"], cwd=wd, env={**e, **extra}, capture_output=True, text=True,
                           timeout=180)
        assert r.returncode == 0, r.stderr
        return _answers(r.stdout)[0]

    first = run(OMP_NUM_THREADS="1", TZ="UTC0", TMPDIR=str(tmp_a))
    second = run(OMP_NUM_THREADS="3", TZ="JST-9", TMPDIR=str(tmp_b))
    third = run()
    assert first[4] == second[4] == third[4]  # one zygote forked them all
    assert len(_agent_pids(rt_dir)) == 1
    assert first[:4] == (1, "1", 0, str(tmp_a))
    assert second[:4] == (3, "3", 9 * 3600, str(tmp_b))
    # No OMP_NUM_THREADS: torch's own default, as a fresh interpreter has it.
    e = {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=e,
                           capture_output=True, text=True, timeout=120, check=True)
    assert third[0] == int(fresh.stdout) and third[1] is None


def test_files_of_gone_agents_are_swept_and_a_live_ones_are_kept(shared_env):
    """Each code tree or setting makes a new agent key, and each left its .lock and .log (40 of them
    here once).  Starting an agent removes those of keys whose agent is gone; never a live agent's,
    one a starter holds, or another user's."""
    import fcntl
    import socket as socketlib

    from monarch_agents.local_agent import sweep

    env, rt_dir, wd = shared_env
    first = _run(env, wd)
    assert first.returncode == 0, first.stderr
    live = sorted(p.name for p in rt_dir.iterdir())
    assert [n.rsplit(".", 1)[1] for n in live] == ["lock", "log", "sock"], live
    # Gone agents: a pair of a clean exit, and a killed one's socket that refuses connections.
    for name in ("agent-0000dead.lock", "agent-0000dead.log", "agent-1111dead.log"):
        (rt_dir / name).write_text("")
    dead = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_SEQPACKET)
    dead.bind(str(rt_dir / "agent-1111dead.sock"))
    dead.close()
    # Being started right now: its lock is held.
    (rt_dir / "agent-2222busy.lock").write_text("")
    (rt_dir / "agent-2222busy.log").write_text("")
    busy = os.open(rt_dir / "agent-2222busy.lock", os.O_RDWR)
    fcntl.flock(busy, fcntl.LOCK_EX)
    # Another user's (root only: chown).
    theirs = []
    if os.geteuid() == 0:
        for suffix in ("lock", "log"):
            p = rt_dir / f"agent-3333them.{suffix}"
            p.write_text("")
            os.chown(p, 65534, 65534)
            theirs.append(p.name)
    try:
        # A script with another setting: another key, so an agent starts, and sweeps first.
        second = _run({**env, "MONARCH_AGENT_IDLE_S": "61"}, wd)
        assert second.returncode == 0, second.stderr
        left = sorted(p.name for p in rt_dir.iterdir())
        # By their names (a live agent's key is hex: "dead" may be in it, as in agent-0c175c0e74dead30793e).
        assert not [n for n in left if n.startswith(("agent-0000dead.", "agent-1111dead."))], left
        assert set(live) <= set(left)  # the first agent lives on (its log is locked by it)
        assert {"agent-2222busy.lock", "agent-2222busy.log", *theirs} <= set(left)
        assert len(_agent_pids(rt_dir)) == 2
        assert _run(env, wd).returncode == 0  # the first agent still answers
    finally:
        os.close(busy)
    # Once the busy starter let go, and every agent stopped: everything of ours goes.
    pids = _agent_pids(rt_dir)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    assert wait_gone(pids, 10) == []
    deadline = time.monotonic() + 10  # their zygotes follow them (parent-death signal), and let go of the logs
    while sorted(p.name for p in rt_dir.iterdir()) != sorted(theirs) and time.monotonic() < deadline:
        sweep(str(rt_dir))
        time.sleep(0.1)
    assert sorted(p.name for p in rt_dir.iterdir()) == sorted(theirs)
