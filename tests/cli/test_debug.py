"""End to end: breakpoint() in ranks and actors of a real 2-host reservation, driven by `monarch debug`.

Each test starts a real `monarch run` whose ranks stop in pdb, then drives the real
`monarch debug` through standard input (and once through a real terminal, in tmux).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.cli.conftest import MONARCH, ROOT, monarch

WAITING = "waiting in the debugger (monarch debug)"


class BackgroundRun:
    """`monarch run ...` in the background; its stderr goes to a file the test can poll."""

    def __init__(self, cwd, *args):
        self.err_path = os.path.join(cwd, f"run-{time.monotonic_ns()}.err")
        self.out_path = self.err_path[:-4] + ".out"
        env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
        with open(self.err_path, "w") as err, open(self.out_path, "w") as out:
            self.proc = subprocess.Popen([*MONARCH, "run", *args], cwd=cwd, stdout=out, stderr=err, env=env)

    def stderr(self) -> str:
        with open(self.err_path) as f:
            return f.read()

    def stdout(self) -> str:
        with open(self.out_path) as f:
            return f.read()

    def wait_waiting(self, n: int, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = self.stderr()
            if text.count(WAITING) >= n:
                return text
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{n} ranks never waited in the debugger:\n{self.stdout()}\n{self.stderr()}")

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def runs():
    started = []

    def start(cwd, *args):
        r = BackgroundRun(cwd, *args)
        started.append(r)
        return r

    yield start
    for r in started:
        r.kill()


def debug(cwd, *lines, timeout=60):
    """`monarch debug` with these lines on standard input."""
    return monarch("debug", cwd=cwd, input="".join(line + "\n" for line in lines), timeout=timeout)


def sessions(cwd):
    r = monarch("debug", "list", "--json", cwd=cwd, check=True)
    return json.loads(r.stdout)


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


PLAIN = """\
    import os, pdb
    rank = int(os.environ["NODE_RANK"])
    loss = 0.5 + rank
    def step(loss):
        if rank == 0:
            pdb.set_trace()
        else:
            breakpoint()
        return loss * 2
    print("result", rank, step(loss), flush=True)
"""


def test_plain_command_on_two_hosts(workdir, runs):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    script = write(workdir / "train.py", PLAIN)
    run = runs(workdir, "--", sys.executable, script)
    run.wait_waiting(2)
    listed = sessions(workdir)
    assert sorted((s["rank"], s["host"], s["function"], s["waiting"]) for s in listed) == \
        [(0, "host0", "step", True), (1, "host1", "step", True)]
    assert all(s["where"] == "train.py:9" for s in listed)
    # The same sessions through telemetry, for other tools.
    r = monarch("query", "--format", "json", "select rank, host, function, waiting from debug_sessions order by rank",
                cwd=workdir, check=True)
    assert [(x["rank"], x["host"], x["function"], x["waiting"]) for x in json.loads(r.stdout)["rows"]] == \
        [(0, "host0", "step", True), (1, "host1", "step", True)]
    r = debug(workdir, "list", "attach 1", "p loss", "detach", "cast ranks(0,1) p loss * 10", "continue", "quit")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "monarch_dbg> " in out and "  id  rank  host" in out
    assert "Attached to debug session for train.py 1 (host1)" in out
    assert "-> return loss * 2" in out and "(Pdb) 1.5" in out
    assert "[rank 0] 5.0" in out and "[rank 1] 15.0" in out
    assert "rank 0 continued" in out and "rank 1 continued" in out
    assert run.wait() == 0, run.stderr()
    assert "[host0] result 0 1.0" in run.stdout() and "[host1] result 1 3.0" in run.stdout()
    # Once per session, naming the rank.
    err = run.stderr()
    assert err.count(f"rank 0 {WAITING}") == 1 and err.count(f"rank 1 {WAITING}") == 1
    # Where pdb stopped, as `list` says (train.py:9), not the breakpoint() line above it.
    assert f"rank 1 {WAITING} at train.py:9" in err, err


TORCHRUN = """\
    import os
    rank = int(os.environ["RANK"])
    loss = 0.25 * rank
    if rank in (1, 2):
        breakpoint()
    print("done", rank, loss, flush=True)
"""


def test_torchrun_workers(workdir, runs):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    script = write(workdir / "tr.py", TORCHRUN)
    run = runs(workdir, "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", script)
    run.wait_waiting(2, timeout=120)
    listed = sessions(workdir)
    assert sorted((s["rank"], s["host"]) for s in listed) == [(1, "host0"), (2, "host1")]
    r = debug(workdir, "attach tr.py 2", "p loss", "detach", "cast ranks(1:3) p rank", "continue", "quit")
    assert r.returncode == 0, r.stderr
    assert "(Pdb) 0.5" in r.stdout
    assert "[rank 1] 1" in r.stdout and "[rank 2] 2" in r.stdout
    assert run.wait(120) == 0, run.stderr()
    assert "[host1] done 2 0.5" in run.stdout()


ACTORS = """\
    from monarch.actor import Actor, current_rank, endpoint
    from monarch.job import job_load

    class Trainer(Actor):
        def __init__(self):
            self.loss = 0.0

        @endpoint
        def step(self, lr: float) -> float:
            rank = current_rank().rank
            loss = 1.0 + rank * lr
            if rank in (1, 2):
                breakpoint()
            self.loss = loss
            return loss

    if __name__ == "__main__":
        procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 2})
        trainers = procs.spawn("trainers", Trainer)
        print("losses", sorted(trainers.step.call(0.5).get().values()), flush=True)
        procs.stop().get()
"""


def test_actor_endpoint(workdir, runs):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    script = write(workdir / "act.py", ACTORS)
    run = runs(workdir, script)
    run.wait_waiting(2)
    listed = sessions(workdir)
    assert sorted((s["actor"], s["rank"], s["host"], s["coords"]["gpus"]) for s in listed) == \
        [("trainers", 1, "host0", 1), ("trainers", 2, "host1", 0)]
    r = debug(workdir, "attach trainers 2", "p loss", "detach", "cast trainers ranks(hosts=(0,1)) p loss",
              "continue", "quit")
    assert r.returncode == 0, r.stderr
    assert "(Pdb) 2.0" in r.stdout
    assert "[rank 1] 1.5" in r.stdout and "[rank 2] 2.0" in r.stdout
    assert run.wait() == 0, run.stderr()
    assert "losses [1.0, 1.5, 2.0, 2.5]" in run.stdout()
    assert f"actor trainers rank 2 {WAITING}" in run.stderr()


LOOP = """\
    import os, sys, time
    rank = int(os.environ["NODE_RANK"])
    value = 40 + rank
    breakpoint()
    print("finished", rank, flush=True)
"""


def test_bad_input(workdir, runs):
    """Malformed commands, cast to ranks with no session, attaching to a session that just ended,
    a second debugger, the debugger killed while attached, binary output."""
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    script = write(workdir / "loop.py", LOOP)
    run = runs(workdir, "--", sys.executable, script)
    run.wait_waiting(2)
    r = debug(workdir, "bogus", "attach", "cast ranks(1,", "cast ranks(7) p 1", "list",
              "cast ranks(0) c", "attach 0", "list", "quit")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.endswith("Error parsing input: unknown command 'bogus' (try 'help')") for line in lines)
    assert sum("Error parsing input: " in line for line in lines) == 3
    assert "Error: no debug session matches ranks(7)" in r.stdout
    assert "[rank 0] session ended: rank 0 continued" in r.stdout
    assert "Error: session 0 has ended (its rank continued or exited)" in r.stdout

    # A debugger killed while attached: the rank stays paused, and a second debugger is told who holds it.
    first = subprocess.Popen([*MONARCH, "debug"], cwd=workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        first.stdin.write("attach 0\n")
        first.stdin.flush()
        deadline = time.monotonic() + 20
        while not sessions(workdir)[0]["held_by"]:
            assert time.monotonic() < deadline, "the first debugger never held the session"
            time.sleep(0.1)
        r = debug(workdir, "attach 0", "quit")
        assert "is held by another debugger (" in r.stdout and f"pid {first.pid})" in r.stdout
    finally:
        first.kill()
        first.wait()
    deadline = time.monotonic() + 10
    while sessions(workdir)[0]["held_by"]:
        assert time.monotonic() < deadline, "a dead debugger still holds the session"
        time.sleep(0.1)
    # Attached again; binary output does not break the debugger or the terminal.
    r = debug(workdir, "attach 0", "p value", "!import sys; sys.stdout.buffer.write(bytes(range(256))); sys.stdout.flush()",
              "p value + 1", "detach", "quit")
    assert r.returncode == 0, r.stderr
    assert "(Pdb) 41" in r.stdout and "(Pdb) 42" in r.stdout
    assert "\\x1b" in r.stdout and "\x1b" not in r.stdout and "\x00" not in r.stdout
    r = debug(workdir, "continue", "quit")
    assert "rank 1 continued" in r.stdout
    assert run.wait() == 0, run.stderr()


def test_rank_killed_while_attached(workdir, runs):
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    script = write(workdir / "loop.py", LOOP)
    run = runs(workdir, "--", sys.executable, script)
    run.wait_waiting(1)
    pid = sessions(workdir)[0]["pid"]
    dbg = subprocess.Popen([*MONARCH, "debug"], cwd=workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        dbg.stdin.write("attach 0\n")
        dbg.stdin.flush()
        deadline = time.monotonic() + 20
        while not sessions(workdir)[0]["held_by"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: dbg.stdout.read(1), "")), daemon=True)
        reader.start()
        os.kill(pid, signal.SIGKILL)
        # The next line goes to the debugger only once it has said the session ended: sent before, it
        # is the rank's pdb that reads it (a `list` of the source), as a loaded machine showed.
        deadline = time.monotonic() + 30
        while f"ended: rank 0 exited (pid {pid} on host0)" not in "".join(chunks):
            assert time.monotonic() < deadline and dbg.poll() is None, "".join(chunks)
            time.sleep(0.05)
        dbg.stdin.write("list\nquit\n")
        dbg.stdin.close()
        dbg.wait(timeout=30)
        reader.join(timeout=30)
        out = "".join(chunks)
    finally:
        if dbg.poll() is None:
            dbg.kill()
            dbg.wait()
    assert dbg.returncode == 0
    assert out.rstrip().endswith("no debug sessions (a rank that calls breakpoint() shows up here)\nmonarch_dbg>")
    assert run.wait() != 0


def test_post_mortem_and_source_from_the_client(workdir, runs, tmp_path_factory):
    """`monarch run --pdb`: the failing rank waits; its file is missing on the host (the rank runs it from
    another directory), so `list` shows lines the client sent."""
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    write(workdir / "fails.py", """\
        import os
        rank = int(os.environ["NODE_RANK"])
        scale = 7
        if rank == 1:
            total = scale * 6
            raise ValueError("boom")
    """)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    code = "exec(compile(open(%r).read(), 'fails.py', 'exec'))" % str(workdir / "fails.py")
    run = runs(workdir, "--pdb", "--workdir", str(elsewhere), "--", sys.executable, "-c", code)
    err = run.wait_waiting(1)
    assert f"rank 1 {WAITING} after an uncaught exception at fails.py:6" in err
    [s] = sessions(workdir)
    assert s["kind"] == "post_mortem" and s["file"] == "fails.py"
    r = debug(workdir, "attach 0", "p total", "l", "c", "quit")
    assert "(Pdb) 42" in r.stdout
    assert 'raise ValueError("boom")' in r.stdout  # source lines sent from this machine
    assert "ended: rank 1" in r.stdout
    assert run.wait() == 1
    assert "ValueError: boom" in run.stdout() + run.stderr()


INTERRUPTED = """\
    import os
    rank = int(os.environ["NODE_RANK"])
    x = 5 + rank
    breakpoint()
    y = x + 1
    print("result", rank, y, flush=True)
"""


def test_an_interrupt_then_continue_or_next_at_once_through_the_client_library(workdir, runs):
    """DebugClient, what `monarch debug` and the dashboard drive: Ctrl-C stops the command the rank's pdb runs;
    `c` (rank 0), or `n` then `c` (rank 1), straight after it lets each rank run to its end with exit 0."""
    from monarch._workbench.debug import DebugClient
    from monarch._workbench.reserve import load_live
    from monarch._workbench.state import StatePaths

    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    script = write(workdir / "intr.py", INTERRUPTED)
    run = runs(workdir, "--", sys.executable, script)
    run.wait_waiting(2)
    record, _ = load_live(paths=StatePaths(str(workdir)))
    client = DebugClient(record)
    by_rank = {s.rank: s for s in client.refresh()}
    for rank, then in ((1, ["n", "c"]), (0, ["c"])):
        a = client.attach(by_rank[rank])
        try:
            if not a.waiting:
                assert a.run_until_waiting(None, timeout=30)[1] is None
            a.send_line("p print('sleeping', flush=True) or __import__('time').sleep(60)")
            end = time.monotonic() + 30
            while f"[host{rank}] sleeping" not in run.stdout():  # the interrupt lands inside the command
                assert time.monotonic() < end, run.stdout()
                time.sleep(0.05)
            a.interrupt()
            out, ended = a.run_until_waiting(None, timeout=30)
            assert ended is None and out.endswith(b"*** KeyboardInterrupt\n(Pdb) "), out
            if then[0] == "n":
                out, ended = a.run_until_waiting("n", timeout=30)
                assert ended is None and b"-> print(\"result\", rank, y, flush=True)" in out, out
            out, ended = a.run_until_waiting("c", timeout=30)
            assert ended == f"rank {rank} continued", (out, ended)
        finally:
            a.detach()
    assert run.wait() == 0, run.stderr()
    assert "[host0] result 0 6" in run.stdout() and "[host1] result 1 7" in run.stdout()


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_interactive_in_a_real_terminal(workdir, runs):
    """Line editing, tab completion from the rank, Ctrl-C interrupting the remote command, continue."""
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    script = write(workdir / "loop.py", LOOP)
    run = runs(workdir, "--", sys.executable, script)
    run.wait_waiting(1)
    sock = f"monarch-dbg-{os.getpid()}"
    tmux = ["tmux", "-L", sock]
    env = f"PYTHONPATH={ROOT} NO_COLOR=1"
    subprocess.run([*tmux, "new-session", "-d", "-s", "dbg", "-x", "120", "-y", "40",
                    f"cd {workdir} && {env} {' '.join(MONARCH)} debug"], check=True)

    def screen():
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "dbg"], capture_output=True, text=True).stdout

    def keys(*k, until, timeout=20):
        subprocess.run([*tmux, "send-keys", "-t", "dbg", *k], check=True)
        end = time.monotonic() + timeout
        while until not in screen():
            assert time.monotonic() < end, f"never saw {until!r}:\n{screen()}"
            time.sleep(0.1)

    try:
        keys(until="monarch_dbg>")  # (capture-pane drops trailing spaces)
        keys("attach 0", "Enter", until="(Pdb)")
        keys("p val", "Tab", until="p value")  # completed by the rank's pdb
        keys("Enter", until="\n40\n")
        # Ctrl-C once the rank runs the command (its print reached the run's output), not while this
        # terminal or the rank may still be reading it: under load that took over 0.5 s (CI, once).
        keys("p print('sleeping', flush=True) or __import__('time').sleep(60)", "Enter", until="sleep(60)\n")
        end = time.monotonic() + 30
        while "sleeping" not in run.stdout():
            assert time.monotonic() < end, f"the rank never ran the command:\n{screen()}"
            time.sleep(0.1)
        keys("C-c", until="KeyboardInterrupt")
        keys("c", "Enter", until="ended: rank 0 continued")  # at once: the rank still ends with 0
        keys("quit", "Enter", until="")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert run.wait() == 0, run.stderr()
    assert "finished 0" in run.stdout()


def test_run_spmd_torchrun_ranks(workdir):
    """monarch.job.spmd's run_spmd(): a torchrun worker on the second host stops; `monarch debug` continues it."""
    write(workdir / "tr.py", TORCHRUN)
    (workdir / "driver.py").write_text(textwrap.dedent(f"""
        from monarch.job.spmd import serve
        job = serve([{sys.executable!r}, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "tr.py"],
                    scheduler="local_cwd")
        print("EXIT", job.run_spmd().exit_codes, flush=True)
    """))
    err_path = workdir / "driver.err"
    with open(err_path, "w") as err:
        driver = subprocess.Popen([sys.executable, "driver.py"], cwd=workdir, stdout=subprocess.PIPE, stderr=err,
                                  text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        end = time.monotonic() + 120
        while f"rank 1 {WAITING}" not in err_path.read_text():
            assert time.monotonic() < end and driver.poll() is None, err_path.read_text()
            time.sleep(0.1)
        r = debug(workdir, "cast ranks(1) p loss", "continue", "quit")
        assert "[rank 1] 0.25" in r.stdout and "rank 1 continued" in r.stdout
        out, _ = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0 and "EXIT {0: 0, 1: 0}" in out, out + err_path.read_text()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_stopped_debugger_holds_the_agent_to_a_window(workdir, runs):
    """pdb printing 400 MiB to a `monarch debug` that reads nothing (its stdout is a pipe nobody reads,
    then SIGSTOP): the host agent keeps at most its window (DebugAck), pdb blocks on its write; after
    SIGCONT the output arrives whole and the session goes on."""
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    agent = json.loads(monarch("--json", "status", cwd=workdir, timeout=60, check=True).stdout)["hosts"][0]["pid"]
    script = write(workdir / "loud.py", """\
        x = 5
        breakpoint()
        print("after", x * 2, flush=True)
    """)
    run = runs(workdir, "--", sys.executable, script)
    run.wait_waiting(1)
    rest = _rss_mb(agent)
    counter = workdir / "printed"
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    client = subprocess.Popen([*MONARCH, "debug"], cwd=workdir, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        # pdb counts the MiB it printed in a file; the client reads its stdin but writes to a full pipe.
        client.stdin.write(b"attach 0\n!for i in range(400): print('y' * 1048575); open(%r, 'w').write(str(i + 1))\n"
                           % str(counter).encode())
        client.stdin.flush()
        deadline = time.monotonic() + 60
        while not counter.exists() and time.monotonic() < deadline:  # it attached and pdb prints
            time.sleep(0.05)
        os.kill(client.pid, signal.SIGSTOP)
        peak, printed = 0.0, []
        deadline = time.monotonic() + 120
        # Until pdb stopped printing: more than the agent's window is out, and nothing moved for 2 s.
        while time.monotonic() < deadline:
            time.sleep(0.2)
            peak = max(peak, _rss_mb(agent))
            printed.append(int(counter.read_text() or 0) if counter.exists() else 0)
            if printed[-1] >= 400 or (printed[-1] > 16 and len(printed) > 10 and printed[-1] == printed[-10]):
                break
        assert 16 < printed[-1] < 400, printed  # blocked, not done: unbounded, it prints it all in seconds
        assert peak < rest + 64, (rest, peak)
        print(f"agent VmRSS: {rest:.0f} MB at rest, {peak:.0f} MB at most while the debugger was stopped")
        os.kill(client.pid, signal.SIGCONT)
        # Everything arrives once it reads again (pdb's 400 lines, the prompt), and the session goes on.
        client.stdin.write(b"p x * 7\nc\nquit\n")
        client.stdin.close()
        ys, tail = 0, b""
        while chunk := client.stdout.read1(1 << 20):
            ys += chunk.count(b"y")
            tail = (tail + chunk)[-65536:]
        assert ys >= 400 * 1048575 and b"35" in tail and b"rank 0 continued" in tail, (ys, tail[-2000:])
        assert client.wait(60) == 0
    finally:
        if client.poll() is None:
            os.kill(client.pid, signal.SIGCONT)
            client.kill()
            client.wait(30)
    assert run.wait() == 0, run.stderr()
    assert "[host0] after 10" in run.stdout()
