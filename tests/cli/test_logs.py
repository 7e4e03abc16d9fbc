"""`monarch logs`: whole, byte for byte, streams in the order they came, -f without a lost line,
actor programs recorded, --list with exit codes and durations."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

from monarch.errors import ExitCode
from tests.cli.conftest import MONARCH, ROOT, monarch

# 6 MiB of bytes that are not text (every byte value, NULs and lone CRs included), more than one
# read of the agent's log holds; the same bytes every time.
_BINARY = ("import hashlib, sys\n"
           "out = b''.join(hashlib.sha256(i.to_bytes(4, 'big')).digest() for i in range(6 * 2**20 // 32))\n"
           "sys.stdout.buffer.write(out); sys.stdout.flush()\n")


def _expected_binary() -> bytes:
    return b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(6 * 2**20 // 32))


def _raw(*args, cwd) -> subprocess.CompletedProcess:
    """The real command with stdout as bytes."""
    return subprocess.run([*MONARCH, *args], cwd=cwd, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})


def test_large_binary_output_comes_back_byte_for_byte(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    (workdir / "emit.py").write_text(_BINARY)
    r = monarch("run", "--json", "--", sys.executable, "emit.py", cwd=workdir, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    want = _expected_binary()
    for rank in ("0", "1"):
        got = _raw("logs", "--rank", rank, "--stdout", cwd=workdir)
        assert got.returncode == 0
        assert len(got.stdout) == len(want) and got.stdout == want
        got = _raw("logs", "--rank", rank, cwd=workdir)  # both streams: stderr was empty
        assert got.stdout == want


def test_streams_interleaved_as_they_came_and_filtered(workdir):
    monarch("serve", cwd=workdir, check=True)
    script = "import sys, time\n" + "".join(
        f"sys.{s}.write('{s}-{i}\\n'); sys.{s}.flush(); time.sleep(0.02)\n"
        for i, s in enumerate(["stdout", "stderr", "stdout", "stderr", "stdout"]))
    (workdir / "mix.py").write_text(script)
    r = monarch("run", "--", sys.executable, "mix.py", cwd=workdir)
    assert r.returncode == 0
    r = monarch("logs", cwd=workdir, check=True)  # one rank: its bytes as they came, no prefix
    assert r.stdout == "stdout-0\nstderr-1\nstdout-2\nstderr-3\nstdout-4\n"
    assert monarch("logs", "--stderr", cwd=workdir).stdout == "stderr-1\nstderr-3\n"
    assert monarch("logs", "--stdout", "--prefix", cwd=workdir).stdout == "[host0] stdout-0\n[host0] stdout-2\n[host0] stdout-4\n"
    doc = json.loads(monarch("logs", "--json", cwd=workdir).stdout)
    assert doc["ranks"][0]["stderr"] == "stderr-1\nstderr-3\n" and doc["ranks"][0]["complete"] is True


def test_follow_loses_no_line(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    # Many lines, some long, written over time while `logs -f` reads.
    script = ("import sys, time\n"
              "for i in range(3000):\n"
              "    sys.stdout.write(f'line {i} ' + 'x' * (i % 700) + '\\n')\n"
              "    if i % 500 == 0: sys.stdout.flush(); time.sleep(0.1)\n")
    (workdir / "many.py").write_text(script)
    r = monarch("--json", "run", "--detach", "--", sys.executable, "many.py", cwd=workdir, check=True)
    run_id = json.loads(r.stdout)["run_id"]
    r = monarch("logs", "--run", run_id, "-f", cwd=workdir, check=True, timeout=120)
    for host in ("host0", "host1"):
        lines = [line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith(f"[{host}] ")]
        assert lines == [f"line {i} " + "x" * (i % 700) for i in range(3000)]


def test_actor_program_runs_are_recorded_and_listed(workdir):
    monarch("serve", cwd=workdir, check=True)
    prog = workdir / "prog.py"
    prog.write_text("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n")
    r = monarch("run", str(prog), cwd=workdir)
    assert r.returncode == 3 and r.stdout == "to stdout\n" and "to stderr" in r.stderr
    assert monarch("run", "--", "true", cwd=workdir).returncode == 0
    runs = json.loads(monarch("logs", "--list", "--json", cwd=workdir, check=True).stdout)
    assert [(x["kind"], x["exit_code"]) for x in runs] == [("program", 3), ("command", 0)]
    assert all(x["duration_s"] is not None and x["duration_s"] >= 0 for x in runs)
    r = monarch("logs", "--run", runs[0]["run_id"], cwd=workdir, check=True)
    assert r.stdout == "to stdout\nto stderr\n"
    listing = monarch("logs", "--list", cwd=workdir, check=True).stdout.splitlines()
    assert "exit 3" in listing[0] and "exit 0" in listing[1]


def test_list_learns_how_a_detached_run_ended(workdir):
    monarch("serve", cwd=workdir, check=True)
    r = monarch("--json", "run", "--detach", "--", "sh", "-c", "exit 4", cwd=workdir, check=True)
    run_id = json.loads(r.stdout)["run_id"]
    monarch("logs", "--run", run_id, "-f", cwd=workdir, check=True)  # until it ended
    runs = json.loads(monarch("logs", "--list", "--json", cwd=workdir, check=True).stdout)
    assert runs[-1]["run_id"] == run_id and runs[-1]["exit_code"] == 4 and not runs[-1]["running"]


def test_list_says_exit_unknown_for_a_damaged_exit_file_and_looks_again_later(workdir):
    monarch("serve", cwd=workdir, check=True)
    r = monarch("--json", "run", "--detach", "--", "sh", "-c", "exit 4", cwd=workdir, check=True)
    run_id = json.loads(r.stdout)["run_id"]
    monarch("logs", "--run", run_id, "-f", cwd=workdir, check=True)  # until it ended
    [exit_file] = list((workdir / ".monarch").rglob(f"runs/{run_id}/0.exit"))
    whole = exit_file.read_bytes()
    assert json.loads(whole)["code"] == 4
    assert [p.name for p in exit_file.parent.iterdir() if ".tmp" in p.name] == []  # renamed in, nothing left
    exit_file.write_bytes(whole[: len(whole) // 2])  # half a record, as a non-atomic writer could leave it
    runs = json.loads(monarch("logs", "--list", "--json", cwd=workdir, check=True).stdout)
    assert runs[-1]["run_id"] == run_id and runs[-1]["exit_code"] is None and not runs[-1]["running"]
    assert "unreadable exit file of rank 0 on host0" in runs[-1]["exit_unknown"]
    listing = monarch("logs", "--list", cwd=workdir, check=True).stdout
    assert "exit ?" in listing and "unreadable exit file" in listing and "Traceback" not in listing
    exit_file.write_bytes(whole)  # not noted as ended meanwhile: the next --list reads it again
    runs = json.loads(monarch("logs", "--list", "--json", cwd=workdir, check=True).stdout)
    assert runs[-1]["exit_code"] == 4 and "exit_unknown" not in runs[-1]


def test_logs_of_a_run_that_is_not_there_fail_at_once_even_with_follow(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    r = monarch("logs", "-f", cwd=workdir, timeout=30)  # "the last run", and there is none yet
    assert r.returncode == ExitCode.USAGE and r.stderr.count("\n") <= 2 and "no runs yet" in r.stderr
    assert monarch("run", "--", "true", cwd=workdir).returncode == 0
    r = monarch("--json", "logs", "-f", "--run", "20990101-000000-typo00", cwd=workdir, timeout=30)
    doc = json.loads(r.stdout)
    assert r.returncode == ExitCode.USAGE and "no run '20990101-000000-typo00'" in doc["error"]
    assert "monarch logs --list" in doc["hint"]
    # A run the history knows but host1 does not (its logs were removed, or the host replaced since):
    # -f says so instead of waiting for output that will never come.
    [run] = json.loads(monarch("logs", "--list", "--json", cwd=workdir, check=True).stdout)
    [gone] = list((workdir / ".monarch").rglob(f"logs/host1/runs/{run['run_id']}"))
    shutil.rmtree(gone)
    r = monarch("logs", "-f", "--run", run["run_id"], cwd=workdir, timeout=60)
    assert r.returncode == ExitCode.RUN and "Traceback" not in r.stderr
    assert f"run {run['run_id']} never started on host1" in r.stderr and "host0" not in r.stderr.splitlines()[0]
    assert monarch("logs", "-f", "--run", run["run_id"], "--rank", "0", cwd=workdir).returncode == 0  # host0 has it


def test_a_runaway_rank_log_is_capped_head_and_tail_kept_and_said_once(workdir):
    """A rank printing far more than its log's cap (``-e MONARCH_RUN_LOG_MAX=256K``): the terminal gets
    every byte, the log on disk stays under the cap with its head and tail, and one line says so."""
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    n = 400_000  # 8-byte lines: 3.2 MB, a dozen times the cap
    script = f"for i in range({n}): print(f'{{i:07d}}')"
    r = _raw("run", "-e", "MONARCH_RUN_LOG_MAX=256K", "--", sys.executable, "-c", script, cwd=workdir)
    assert r.returncode == 0, r.stderr[-2000:]
    # The live stream lost nothing.
    assert r.stdout.count(b"\n") == n and r.stdout.endswith(b"[host0] 0399999\n"), r.stdout[-200:]
    warnings = [line for line in r.stderr.decode().splitlines() if "its log was cut" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: rank 0 on host0: its log was cut at 256 KiB"), r.stderr
    # On disk: under the cap (plus the note), no tail file left.
    run_dirs = [os.path.join(d, x) for d, _, files in os.walk(workdir / ".monarch") for x in files if x == "0.stdout"]
    assert len(run_dirs) == 1, run_dirs
    folder = os.path.dirname(run_dirs[0])
    assert run_dirs[0].removesuffix(".stdout") in warnings[0]  # where
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in ("0.stdout", "0.stderr", "0.order"))
    assert size <= (256 << 10) + 1024, size
    assert not [f for f in os.listdir(folder) if ".tail" in f and f != "0.tails"]  # the index of the tail stays
    # `monarch logs`: the head, the note in place, the tail.
    got = _raw("logs", cwd=workdir)
    assert got.returncode == 0, got.stderr
    out = got.stdout + got.stderr
    assert b"0000000\n0000001\n" in got.stdout and got.stdout.rstrip().endswith(b"0399999")
    assert b"[monarch: its log was cut at 256 KiB" in out


def test_follow_shows_a_capped_logs_tail_as_it_comes(workdir):
    """`logs -f` of a rank whose log reached its cap shows the output after the cap as it comes (as
    `tail -f` would), not only once the rank ended; and the end of the log once, after its note."""
    import queue
    import threading

    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    go = workdir / "go"
    script = ("import os, sys, time\n"
              "for i in range(100_000): print(f'{i:07d}')\n"  # 800 KB: a dozen times the cap
              "print('PAST-THE-CAP', flush=True)\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
              "print('AFTER', flush=True)\n")
    r = monarch("--json", "run", "--detach", "-e", "MONARCH_RUN_LOG_MAX=64K", "--", sys.executable, "-c", script,
                cwd=workdir, check=True)
    run_id = json.loads(r.stdout)["run_id"]
    follow = subprocess.Popen([*MONARCH, "logs", "--run", run_id, "-f"], cwd=workdir, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in follow.stdout] + [lines.put(None)], daemon=True)
    reader.start()
    try:
        got = []
        while b"PAST-THE-CAP\n" not in got:  # the rank waits for `go`: only a live tail shows this line
            line = lines.get(timeout=90)
            assert line is not None, (b"".join(got[-5:]), follow.stderr.read())
            got.append(line)
        go.touch()
        assert follow.wait(timeout=90) == 0, follow.stderr.read()
        reader.join(timeout=30)
        while (line := lines.get(timeout=5)) is not None:
            got.append(line)
    finally:
        go.touch()
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    out = b"".join(got)
    assert out.startswith(b"0000000\n0000001\n") and out.count(b"PAST-THE-CAP\n") == 1
    # The log's note once (after what the follower saw live, before what it had not: AFTER, or not).
    assert out.count(b"[monarch: its log was cut at 64 KiB") == 1, out[-600:]
    assert out.count(b"AFTER\n") == 1 and out.index(b"AFTER\n") > out.index(b"PAST-THE-CAP\n"), out[-600:]
    assert b"0099999\n" in out


_CHATTY_ACTORS = """
from monarch.actor import Actor, endpoint
from monarch.job import job_load

class Chatty(Actor):
    @endpoint
    def talk(self, n: int) -> int:
        for i in range(n):
            print(f"{i:07d}", flush=(i % 1000 == 0))
        return n

procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 1})
print(procs.spawn("chatty", Chatty).talk.call_one(200_000).get(timeout=120))
procs.stop().get()
"""


def test_a_runaway_procs_log_on_its_host_is_capped_too(workdir):
    """An actor printing far more than the cap on a served host: its `procs/*.log` keeps head, note, tail."""
    monarch("serve", "--hosts", "1", cwd=workdir, check=True, env={"MONARCH_RUN_LOG_MAX": "64K"})
    (workdir / "prog.py").write_text(_CHATTY_ACTORS)
    r = monarch("run", "prog.py", cwd=workdir, timeout=180)
    assert r.returncode == 0 and r.stdout.strip().endswith("200000"), r.stderr[-2000:]
    logs = [os.path.join(d, f) for d, _, files in os.walk(workdir / ".monarch") for f in files
            if os.path.basename(d) == "procs" and f.endswith(".log")]
    assert len(logs) == 1, logs
    data = open(logs[0], "rb").read()
    assert len(data) <= (64 << 10) + 200, len(data)
    assert data.startswith(b"0000000\n") and b"\n[monarch: this log was cut at 64 KiB" in data
    assert data.rstrip().endswith(b"0199999")
    assert not [f for f in os.listdir(os.path.dirname(logs[0])) if ".tail" in f]
