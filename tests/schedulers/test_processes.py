"""OwnedProcess: a pid known with its start time, read from /proc without psutil where it can."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from monarch_schedulers.processes import OwnedProcess, _proc_stat


def test_alive_follows_the_process_and_its_start_time() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owned = OwnedProcess.of(p.pid)
        assert owned.started == psutil.Process(p.pid).create_time()
        assert _proc_stat(p.pid)[0] == owned.started  # the same clock as psutil's
        assert owned.alive()
        assert not OwnedProcess(p.pid, owned.started - 5).alive()  # the pid, but another process
        p.kill()
        while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        assert not owned.alive()  # exited, not reaped yet
    finally:
        p.kill()
        p.wait()
    assert not owned.alive()
