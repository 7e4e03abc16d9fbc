"""End to end on the local scheduler: the real `monarch` command, real agents, real torchrun."""

import json
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time

import psutil
import pytest

from tests.cli.conftest import MONARCH, ROOT, monarch
from tests.helpers import session_pids


def _pids_alive(pids):
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _wait_gone(pids, deadline_s=5.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not _pids_alive(pids):
            return []
        time.sleep(0.05)
    return _pids_alive(pids)


def test_serve_run_twice_reuses_agents_and_matches_reference(workdir):
    r = monarch("--json", "serve", "--hosts", "2", "--procs-per-host", "2", cwd=workdir, check=True)
    first = json.loads(r.stdout)
    assert [h["host"] for h in first["hosts"]] == ["host0", "host1"]
    assert oct(os.stat(workdir / ".monarch" / "job_state.pkl").st_mode & 0o777) == "0o600"
    script = os.path.join(ROOT, "examples", "train_ddp.py")
    losses = []
    for _ in range(2):
        r = monarch("run", "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", script,
                    cwd=workdir, timeout=240)
        assert r.returncode == 0, r.stderr
        m = re.search(r"\[host0\] final_loss ([0-9.]+) world 4", r.stdout)
        assert m, r.stdout + r.stderr
        losses.append(float(m.group(1)))
    again = json.loads(monarch("--json", "serve", "--hosts", "2", "--procs-per-host", "2", cwd=workdir, check=True).stdout)
    assert again["reused"] is True
    assert [h["pid"] for h in again["hosts"]] == [h["pid"] for h in first["hosts"]]
    # Reference: the same training in one process over the whole data set.
    ref = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", script],
                         capture_output=True, text=True, timeout=240, cwd=workdir)
    ref_loss = float(re.search(r"final_loss ([0-9.]+)", ref.stdout).group(1))
    assert losses[0] == losses[1]
    assert abs(losses[0] - ref_loss) < 1e-4
    pids = [h["pid"] for h in first["hosts"]]
    monarch("stop", cwd=workdir, check=True)
    assert _wait_gone(pids) == []
    assert not (workdir / ".monarch" / "job_state.pkl").exists()
    r = monarch("stop", cwd=workdir)
    assert r.returncode == 0


def test_run_env_exit_code_hosts_and_detach(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    r = monarch("run", "--hosts", "1", "--env", "FOO=bar", "--", "sh", "-c", "echo $FOO $NODE_RANK $NNODES $MASTER_ADDR",
                cwd=workdir, check=True)
    assert r.stdout.strip() == "[host1] bar 0 1 127.0.0.1"
    r = monarch("run", "--", "sh", "-c", 'if [ "$NODE_RANK" = 1 ]; then exit 7; fi; sleep 30', cwd=workdir, timeout=30)
    assert r.returncode == 7
    assert "rank 1 on host1 exited with code 7" in r.stderr
    r = monarch("run", "--", "no-such-command-xyz", cwd=workdir)
    assert r.returncode == 127
    r = monarch("--json", "run", "--detach", "--", "sh", "-c", "echo detached-$NODE_RANK", cwd=workdir, check=True)
    run_id = json.loads(r.stdout)["run_id"]
    r = monarch("logs", "--run", run_id, "-f", cwd=workdir, check=True, timeout=30)
    assert "[host0] detached-0" in r.stdout and "[host1] detached-1" in r.stdout
    r = monarch("--json", "status", cwd=workdir, check=True)
    st = json.loads(r.stdout)
    assert st["state"] == "RUNNING" and all(h["agent"] == "up" for h in st["hosts"])


def test_actor_program_reaches_the_reservation_through_job_load(workdir):
    # As in PyTorch Monarch: the job's hosts come from job_load().state(); this_host() is the
    # machine the program runs on (here, a private agent that exits with the program).
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    prog = workdir / "prog.py"
    prog.write_text(
        "import os, socket\n"
        "from monarch.actor import Actor, endpoint, this_host\n"
        "from monarch.job import job_load\n"
        "class A(Actor):\n"
        "    @endpoint\n"
        "    def host(self):\n"
        "        return os.environ['MONARCH_HOSTNAME']\n"
        "hosts = job_load().state().hosts\n"
        "print('extent', dict(hosts.extent))\n"
        "procs = hosts.spawn_procs(per_host={'gpus': 2})\n"
        "print('job', sorted(procs.spawn('a', A).host.call().get().values()))\n"
        "here = this_host().spawn_procs(per_host={'gpus': 1})\n"
        "print('here', here.spawn('b', A).host.call_one().get() == socket.gethostname())\n")
    r = monarch("run", str(prog), cwd=workdir, check=True, env={"MONARCH_HOSTNAME": ""})
    assert "extent {'hosts': 2}" in r.stdout
    assert "job ['host0', 'host0', 'host1', 'host1']" in r.stdout
    assert "here True" in r.stdout


def test_interrupt_stops_every_rank(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    e = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    p = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", "echo started; exec sleep 60"], cwd=workdir,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    assert p.stdout.readline().startswith("[host")
    assert p.stdout.readline().startswith("[host")
    sleepers = _rank_procs("sleep 60")
    assert len(sleepers) == 2
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=10) == 130
    assert _wait_gone(sleepers, 3.0) == []


def test_host_agent_killed_during_run(workdir):
    r = monarch("--json", "serve", "--hosts", "2", cwd=workdir, check=True)
    victim = json.loads(r.stdout)["hosts"][1]["pid"]
    e = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    p = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", "echo go; exec sleep 60"], cwd=workdir,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    p.stdout.readline()
    p.stdout.readline()
    os.kill(victim, signal.SIGKILL)
    code = p.wait(timeout=20)
    err = p.stderr.read()
    assert code != 0
    # Either the run notices first (the agent's connection closed) or the scheduler already knows.
    assert "host agent on host1 died" in err or "host agent(s) host1 exited" in err, err
    r = monarch("status", cwd=workdir)
    assert r.returncode in (3, 5)


def test_two_runs_at_once_refused(workdir):
    monarch("serve", cwd=workdir, check=True)
    e = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    p = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", "echo up; exec sleep 30"], cwd=workdir,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    try:
        p.stdout.readline()
        r = monarch("run", "--", "true", cwd=workdir)
        assert r.returncode == 6
        assert "another `monarch run`" in r.stderr
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=10)


def test_incompatible_serve_is_reported(workdir):
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    r = monarch("serve", "--hosts", "2", cwd=workdir)
    assert r.returncode == 3
    assert "different shape" in r.stderr and "monarch stop" in r.stderr
    r = monarch("--json", "serve", "--hosts", "2", "--replace", cwd=workdir, check=True)
    assert len(json.loads(r.stdout)["hosts"]) == 2


def test_shell_runs_on_a_pty_and_passes_the_exit_code(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    r = monarch("shell", "--host", "1", "--", "sh", "-c", "test -t 0 && echo tty-on $MONARCH_HOSTNAME; exit 3",
                cwd=workdir, stdin=subprocess.DEVNULL)
    assert r.returncode == 3
    assert "tty-on host1" in r.stdout
    r = monarch("shell", "--host", "5", cwd=workdir, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "no host rank 5" in r.stderr


def test_shell_whose_host_agent_is_killed_ends_with_one_line_and_restores_the_terminal(no_leaked_processes, workdir):
    r = monarch("--json", "serve", "--hosts", "2", cwd=workdir, check=True)
    agents = [h["pid"] for h in json.loads(r.stdout)["hosts"]]
    # A real terminal: the shell puts it in raw mode and must give it back however it ends.
    master, slave = os.openpty()
    before = termios.tcgetattr(slave)
    p = subprocess.Popen([*MONARCH, "shell", "--host", "1", "--", "sh", "-c", "echo shell-up; exec sleep 37"],
                         cwd=workdir, stdin=slave, stdout=slave, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})
    try:
        seen = b""
        while b"shell-up" not in seen:
            ready, _, _ = select.select([master], [], [], 30)
            assert ready, f"the shell never started: {seen!r}"
            seen += os.read(master, 4096)
        sleepers = _rank_procs("sleep 37")
        assert len(sleepers) == 1
        os.kill(agents[1], signal.SIGKILL)
        assert p.wait(timeout=30) == 5  # ExitCode.AGENT, as for `monarch run`
        err = p.stderr.read()
        assert "Traceback" not in err
        first, *rest = err.strip().splitlines()
        assert first.startswith("error: host agent on host1 died") and len(rest) <= 1, err
        assert termios.tcgetattr(slave) == before  # not left raw: the terminal still echoes and edits
        assert _wait_gone(sleepers + [agents[1]]) == []  # the shell's command went with its agent
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
        os.close(slave)


def _start_run(workdir, *cmd):
    """`monarch run -- CMD` in the background, returned once both hosts printed their first line."""
    e = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    p = subprocess.Popen([*MONARCH, "run", "--", *cmd], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=e)
    assert p.stdout.readline().startswith("[host")
    assert p.stdout.readline().startswith("[host")
    return p


def _rank_procs(marker):
    """This test session's rank processes (sh or sleep) whose command line contains ``marker``
    (other sessions on the machine may run the same commands).

    A child that a rank's shell forked and has not yet exec'd (the `sleep 0.2` of a loop) shows
    its parent's command line for a moment: only the outermost match is a rank."""
    found = [pid for pid, cmd in session_pids().items() if cmd.split(" ", 1)[0] in ("sh", "sleep") and marker in cmd]
    ranks = []
    for pid in found:
        try:
            if psutil.Process(pid).ppid() not in found:
                ranks.append(pid)
        except psutil.NoSuchProcess:
            continue  # such a child, already exec'd and gone
    return ranks


def test_stop_while_a_run_is_going(workdir):
    r = monarch("--json", "serve", "--hosts", "2", cwd=workdir, check=True)
    agents = [h["pid"] for h in json.loads(r.stdout)["hosts"]]
    p = _start_run(workdir, "sh", "-c", "echo up; exec sleep 61")
    sleepers = _rank_procs("sleep 61")
    assert len(sleepers) == 2
    monarch("stop", cwd=workdir, check=True)
    assert p.wait(timeout=20) != 0
    assert "the reservation was released" in p.stderr.read()
    assert _wait_gone(sleepers + agents) == []
    assert not (workdir / ".monarch" / "job_state.pkl").exists()


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]])
def test_sigterm_and_ctrl_c_twice_stop_ranks_that_ignore_sigterm(workdir, signals):
    # The ranks ignore SIGTERM (as a stuck NCCL/gloo job may): one signal escalates to SIGKILL after a
    # grace period; a second Ctrl-C kills at once.
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    p = _start_run(workdir, "sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.2; done")
    shells = _rank_procs("trap '' TERM")
    assert len(shells) == 2
    for s in signals:
        p.send_signal(s)
    assert p.wait(timeout=10) == 130
    assert _wait_gone(shells, 3.0) == []
