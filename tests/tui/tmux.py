"""A dashboard in a real terminal for tests: a tmux server of its own (this test's environment, not a
server some other checkout started with its own PYTHONPATH), keys in, screen out."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time

import pytest

from tests.cli.conftest import MONARCH, ROOT

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """A dashboard in a real terminal (a tmux server of its own: this test's environment): keys in, screen out."""

    def __init__(self, cwd, cols: int = 110, rows: int = 32):
        self.dir = tempfile.mkdtemp(prefix="monarch-tmux-")
        self.socket = os.path.join(self.dir, "socket")
        self.session = "dash"
        env = {**os.environ, "PYTHONPATH": ROOT, "TERM": "xterm-256color", "SHELL": "/bin/sh"}
        cmd = " ".join(shlex.quote(a) for a in [*MONARCH, "dashboard"])
        self.tmux("new-session", "-d", "-s", self.session, "-x", str(cols), "-y", str(rows), "-c", str(cwd), cmd,
                  env=env)

    def tmux(self, *args: str, env=None) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, env=env)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session).stdout

    def keys(self, *keys: str) -> None:
        assert self.tmux("send-keys", "-t", self.session, *keys).returncode == 0

    def wait_for(self, pred, what: str, timeout: float = 40) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if pred(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen}")

    def dashboard_pid(self) -> int:
        """The dashboard's process: the pane's own, or its one child where a shell started it."""
        import psutil

        pane = psutil.Process(int(self.tmux("display", "-p", "-t", self.session, "#{pane_pid}").stdout))
        for p in [pane, *pane.children()]:
            if "monarch_cli.main" in p.cmdline():
                return p.pid
        raise AssertionError(f"no dashboard process under the pane: {pane.cmdline()}")

    def quit(self) -> None:
        self.keys("q")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.tmux("has-session", "-t", self.session).returncode != 0:
                return
            time.sleep(0.2)
        raise AssertionError(f"q did not quit the dashboard; the screen:\n{self.screen()}")

    def kill(self) -> None:
        self.tmux("kill-server")
        shutil.rmtree(self.dir, ignore_errors=True)
