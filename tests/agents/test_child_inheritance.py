"""What a rank or proc inherits from the agents that start it: the user's descriptor soft limit (not
the one the agents raised for themselves) and a stdin of its own (/dev/null, never a lifeline pipe)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from tests.cli.conftest import monarch
from tests.helpers import ROOT

_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
LOW = 512


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW, _hard))


PROBE = ("import os, resource, select; "
         "r = select.select([0], [], [], 5)[0]; data = os.read(0, 10) if r else b'blocked'; "
         "print('PROBE', resource.getrlimit(resource.RLIMIT_NOFILE)[0], os.readlink('/proc/self/fd/0'), data)")


@pytest.fixture
def workdir(tmp_path):
    yield tmp_path
    monarch("stop", "--force", cwd=tmp_path, timeout=60)


def _raised_limit() -> None:
    """As in a process an agent started after it raised its limit (the client of a script raises its own
    before it starts its private agent: everything below inherits the raised one)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (RAISED, _hard))


RAISED = 4096
needs_room = pytest.mark.skipif(_hard != resource.RLIM_INFINITY and _hard < RAISED,
                                reason=f"the hard descriptor limit ({_hard}) leaves no room to raise to {RAISED}")


@needs_room
def test_raising_the_limit_keeps_the_users_for_the_processes_below():
    code = ("import os, resource; from monarch_agents.transport import raise_fd_limit; raise_fd_limit(); "
            "print(os.environ.get('MONARCH_NOFILE_SOFT'), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_NOFILE_SOFT"}
    r = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                       timeout=60, preexec_fn=_low_limit, check=True)
    kept, now = r.stdout.split()
    assert kept == str(LOW) and int(now) > LOW


@needs_room
def test_ranks_get_the_users_soft_limit_not_the_raised_one_and_dev_null(workdir):
    env = {"MONARCH_NOFILE_SOFT": str(LOW)}  # what the first process to raise it left for those below
    monarch("serve", "--hosts", "1", cwd=workdir, check=True, preexec_fn=_raised_limit, env=env)
    r = monarch("run", "--", sys.executable, "-c", PROBE, cwd=workdir, preexec_fn=_raised_limit, env=env)
    assert r.returncode == 0, r.stderr
    assert f"PROBE {LOW} /dev/null b''" in r.stdout, r.stdout


ACTOR = r"""
import os, resource, select, subprocess, sys
from monarch.actor import Actor, endpoint, this_host

class Probe(Actor):
    @endpoint
    def probe(self):
        r = select.select([0], [], [], 5)[0]
        data = os.read(0, 10) if r else b"blocked"
        # What a command the actor starts gets (a dataloader worker, a tool): the proc's own limit.
        return os.readlink("/proc/self/fd/0"), data

procs = this_host().spawn_procs(per_host={"gpus": 1})
print("ANSWER", procs.spawn("p", Probe).probe.call_one().get(timeout=60), flush=True)
"""


@needs_room
def test_a_private_agents_procs_do_not_read_its_lifeline(tmp_path):
    """The private agent's stdin is the pipe whose end tells it its script is gone; a proc that reads
    stdin reads /dev/null (end of file at once), never that pipe (it would block until the script ends)."""
    (tmp_path / "prog.py").write_text(ACTOR)
    env = {**os.environ, "MONARCH_SHARED_AGENT": "0", "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120, preexec_fn=_low_limit, stdin=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    assert "ANSWER ('/dev/null', b'')" in r.stdout, r.stdout
