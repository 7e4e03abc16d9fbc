"""The dashboard in a real terminal (tmux, a server of its own per test): `monarch shell` on a host
with the app suspended and back, and the process starting again on a replaced reservation.

The module's reservation (2 local hosts) is replaced by the last test.  Only subprocesses
talk to it, so it does not clash with the in-process pilot tests' reservation (one job per process).
"""

from __future__ import annotations

import os
import re
import time

import pytest

from tests.cli.conftest import monarch
from tests.tui.tmux import Tmux, needs_tmux


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("dashboard-terminal")
    monarch("serve", "--hosts", "2", cwd=d, check=True)
    yield d
    monarch("stop", "--force", cwd=d, timeout=60)


@needs_tmux
def test_shell_in_a_real_terminal_and_back_to_the_dashboard(job):
    t = Tmux(job)
    try:
        t.wait_for(lambda s: "host0" in s and "host1" in s and "hosts 2/2" in s, "the dashboard")
        # Only host1 in the tree, then down onto it: the details pane names it.
        t.keys("/")
        t.wait_for(lambda s: "filter by name" in s, "the filter line")
        t.keys("host1")
        t.wait_for(lambda s: "host0" not in s.split("hosts 2/2")[-1], "the filter")
        t.keys("Enter")
        for _ in range(5):
            t.keys("Down")
            time.sleep(0.3)
            if "host host1" in t.screen():
                break
        t.keys("o")
        t.wait_for(lambda s: "Open a shell on host1" in s, "the question")
        t.keys("y")
        t.wait_for(lambda s: "monarch shell on host1" in s and re.search(r"[$#] *$", s.rstrip("\n")), "the shell's prompt")
        t.keys("echo shell-on-$((MONARCH_HOST_RANK * 7))", "Enter")
        t.wait_for(lambda s: "shell-on-7" in s, "the shell's answer")
        t.keys("exit", "Enter")
        t.wait_for(lambda s: "hosts 2/2" in s and "the shell on host1 exited" in s, "the dashboard again")
        t.quit()
    finally:
        t.kill()


@needs_tmux
def test_the_dashboard_process_starts_again_on_a_replaced_reservation(job):
    from monarch._workbench.state import load_state

    state = os.path.join(job, ".monarch", "job_state.pkl")
    old = load_state(state).job_id
    t = Tmux(job)
    try:
        t.wait_for(lambda s: old in s and "hosts 2/2" in s, "the dashboard")
        pid = t.dashboard_pid()
        assert monarch("stop", cwd=job, timeout=60).returncode == 0
        t.wait_for(lambda s: "no reservation" in s, "the banner")
        monarch("serve", "--hosts", "2", cwd=job, check=True)
        new = load_state(state).job_id
        assert new != old
        screen = t.wait_for(lambda s: new in s and "hosts 2/2" in s, "the dashboard on the new job")
        assert old not in screen and "⚠" not in screen
        # The same process (exec'd in place: same pid, same command line) in the same terminal, answering keys.
        assert t.dashboard_pid() == pid
        t.keys("2")
        t.wait_for(lambda s: "command" in s and "ranks" in s, "the runs view")
        t.quit()
    finally:
        t.kill()
