"""HelperProcess: the one way a helper child is started, found ready and stopped by a deadline
(the FUSE mounts, gather_mount, a client's private host agent)."""

from __future__ import annotations

import sys
import time

from monarch_rdmafs.helper import HelperProcess

# Reads its config line, says ready, echoes each command, and ends when its stdin closes.
ECHO = ("import sys\ncfg = sys.stdin.readline().strip()\nprint('ready', flush=True)\n"
        "for line in sys.stdin:\n    print('ok ' + line.strip() + ' ' + cfg, flush=True)\n")


def test_ready_commands_and_stop_when_stdin_closes():
    h = HelperProcess([sys.executable, "-c", ECHO])
    h.start(b"c1\n")
    assert h.wait_ready(60.0) == "ready" and h.alive
    h.send(b"switch m1\n")
    assert h.read_line(60.0) == "ok switch m1 c1"
    assert h.stop(time.monotonic() + 60.0) == 0 and not h.alive
    assert h.stop(time.monotonic()) == 0  # twice is fine


def test_a_child_that_never_answers_is_killed_at_the_deadline():
    h = HelperProcess([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                            "time.sleep(600)"])
    h.start(b"")
    assert h.wait_ready(0.2) == "" and not h.eof and h.alive
    assert h.stop(time.monotonic() + 0.2) == -9


def test_ready_on_a_pipe_of_its_own_and_a_child_that_dies_at_start():
    h = HelperProcess([sys.executable, "-c", "import os, sys\nos.write(int(sys.argv[-1]), b'{\"addr\": 1}\\n')\n"
                                            "sys.stdin.read()", "x"], ready_fd_flag="--info-fd")
    h.start(b"keys\n", keep_stdin=False)
    assert h.wait_ready(60.0) == '{"addr": 1}'
    assert h.stop(time.monotonic() + 60.0) == 0
    dead = HelperProcess([sys.executable, "-c", "raise SystemExit(3)"])
    dead.start()
    assert dead.wait_ready(60.0) == "" and dead.eof
    assert dead.stop(time.monotonic() + 60.0) == 3


def test_detach_leaves_the_child_running():
    """A shared host agent outlives the script that started it: detach closes our pipes, stops nothing."""
    import os
    import signal

    h = HelperProcess([sys.executable, "-c", "import os, sys, time\nos.write(int(sys.argv[-1]), b'up\\n')\n"
                                            "time.sleep(600)"], ready_fd_flag="--info-fd")
    h.start(b"", keep_stdin=False)
    assert h.wait_ready(60.0) == "up"
    h.detach()
    try:
        assert h.alive
    finally:
        os.kill(h.pid, signal.SIGKILL)
        h.wait(60.0)
