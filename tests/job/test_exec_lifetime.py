"""``exec_command``'s owner, as Monarch 0.7.0 documents it: the command starts at once, and a normal
interpreter exit waits for it, and for nothing more (its procs' stop is bounded)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(300)

SCRIPT = r"""
import sys
from monarch.actor import this_host
from monarch.job import exec_command

exec_command(this_host(), ["sh", "-c", 'read line < "$0"; echo "command ended: $line"', sys.argv[1]])
print("main done", flush=True)
"""


def _open_writer(fifo: str, proc: subprocess.Popen) -> int:
    """The FIFO's write end, once the command has it open for reading (fails if the client ends first)."""
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        assert proc.poll() is None, "the client exited before its command ran to the end"
        time.sleep(0.05)


def test_exit_waits_for_the_started_command_then_ends(tmp_path):
    fifo = str(tmp_path / "go")
    os.mkfifo(fifo, 0o600)
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, fifo], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT)
    try:
        assert p.stdout.readline() == "main done\n"
        # The main module has returned: the interpreter is exiting, and waits for the command, which
        # waits for this line.
        fd = _open_writer(fifo, p)
        try:
            os.write(fd, b"go\n")
        finally:
            os.close(fd)
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    assert out == "command ended: go\n", (out, err)
