"""A rank stopped by the first-failure rule keeps everything it printed before the stop (issue 25).

Seen once: `monarch run -- sh -c 'echo out-$MONARCH_HOST_RANK; exit $MONARCH_HOST_RANK'` left host0's
stdout empty.  That rank had printed nothing: rank 1 ended and its SIGTERM reached rank 0 before rank 0's
shell ran its `echo` (the exit file says "killed by SIGTERM").  What must hold is the other half: output a
rank did write before the stop is on disk and on the client's screen, however the stop races the
agent's pump and the client's printer.  The ranks here order that by a marker, not by time.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.cli.conftest import monarch

pytestmark = pytest.mark.timeout(600)

#: Runs in one reservation: the race between the stop and the pump is tried this many times.
REPEAT = 30
#: More than a pipe holds (64 KiB), so some of it is still in the pipe or the pump when the stop lands.
BIG = 200_000


@pytest.mark.parametrize("then", ["exec sleep 300", "exit 0"])
def test_output_written_before_a_first_failure_stop_is_kept(workdir, tmp_path_factory, then):
    """``then``: rank 0 waits to be stopped (SIGTERM reaches it), or ends at once, its last bytes still
    in the pipe while rank 1's failure stops the run (the agent's drain after an exit)."""
    marks = tmp_path_factory.mktemp("marks")
    # Rank 0 prints, says so (the marker), then waits or ends; rank 1 fails once rank 0 printed.
    script = (
        "if [ $MONARCH_HOST_RANK = 0 ]; then "
        f"head -c {BIG} /dev/zero | tr '\\0' x; echo; echo out-0; touch {marks}/$MONARCH_RUN_ID; {then}; "
        f"else while [ ! -e {marks}/$MONARCH_RUN_ID ]; do sleep 0.01; done; echo out-1; exit 1; fi"
    )
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    runs = os.path.join(workdir, ".monarch", "jobs", "default", "logs", "host0", "runs")
    for i in range(REPEAT):
        before = set(os.listdir(marks))
        r = monarch("run", "--", "sh", "-c", script, cwd=workdir, timeout=120)
        assert r.returncode == 1 and "rank 1 on host1 exited with code 1" in r.stderr, (i, r.returncode, r.stderr)
        [run_id] = set(os.listdir(marks)) - before
        lines = r.stdout.splitlines()
        assert f"[host0] {'x' * BIG}" in lines and "[host0] out-0" in lines and "[host1] out-1" in lines, (i, run_id)
        with open(os.path.join(runs, run_id, "0.stdout"), "rb") as f:
            assert f.read() == b"x" * BIG + b"\nout-0\n", (i, run_id)
        with open(os.path.join(runs, run_id, "0.exit")) as f:
            reason = json.load(f)["reason"]
        assert reason == "killed by SIGTERM" or then == "exit 0", (i, run_id, reason)


def test_a_client_stopped_and_continued_mid_write_prints_everything(workdir):
    """`monarch run` writing a long line to a pipe nobody reads yet, stopped and continued (kill -STOP/-CONT):
    every byte reaches its stdout (Python's buffered writer dropped the rest of a write cut short: 64 KiB of
    a 1 MiB line came out)."""
    import glob
    import signal
    import subprocess
    import time

    from tests.cli.conftest import MONARCH, ROOT

    size = 4 << 20
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    client = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", f"head -c {size} /dev/zero | tr '\\0' y; echo"],
                              cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        logs = os.path.join(workdir, ".monarch", "jobs", "default", "logs", "host0", "runs", "*", "0.exit")
        deadline = time.monotonic() + 120
        while not glob.glob(logs):  # the rank is done: the client holds its output, blocked on our pipe
            assert time.monotonic() < deadline and client.poll() is None
            time.sleep(0.05)
        os.kill(client.pid, signal.SIGSTOP)
        while _state(client.pid) != "T":  # stopped, its blocked write cut short
            time.sleep(0.01)
        os.kill(client.pid, signal.SIGCONT)
        out = client.stdout.read()
        assert client.wait(60) == 0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    assert out.count(b"y") == size, out.count(b"y")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2]
