"""A proc's output forwarder (``monarch.actor._logging._Tee``) keeps its pipes drained whatever happens.

Its thread is the only reader of the pipes that became the proc's fds 1 and 2: had it died, the
proc's prints would block once a pipe's 64 KiB filled.  Each case runs in a process of its own (the
forwarder takes over fds 1 and 2), which prints 1 MiB through it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(120)

LINES = 1 << 14  # 64 bytes each: 1 MiB, 16 times a pipe's buffer

PROG = f"""
import os, resource, sys
from monarch.actor import _logging

if sys.argv[1] == "high-fds":
    # Pipes numbered past select()'s 1024 (a proc with many sockets or files open).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
tee = _logging._Tee(0)
if sys.argv[1] == "broken":
    tee.prefix = None  # reading a line for the client now fails (TypeError)
for i in range({LINES}):
    print(f"{{i:063d}}")
sys.stdout.flush()
tee.flush(0)
os.write(tee.pipes[next(iter(tee.pipes))][1], b"done\\n")
"""


@pytest.mark.parametrize("case", ["broken", "high-fds"])
def test_the_forwarder_keeps_draining(case):
    r = subprocess.run([sys.executable, "-c", PROG, case], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[-1] == "done" and lines[:-1] == [f"{i:063d}" for i in range(LINES)]
    if case == "broken":
        assert r.stderr.count("forwarding this proc's output to the client failed") == 1, r.stderr[-3000:]
        assert "TypeError" in r.stderr
    else:
        assert r.stderr == ""
