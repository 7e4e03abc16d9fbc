"""Silencing an agent without a key (issue #24, finding 5): another local user opens 2,000 idle TCP
connections to a host agent's port; the victim's commands still get answers.

The reservation is started with the usual soft limit of 1,024 descriptors (a login node's), which
the flood used to exhaust: the agent now raises its soft limit to the hard one, and closes
connections that have not proved a key within a few seconds (``ZMQ_HANDSHAKE_IVL``)."""

from __future__ import annotations

import json
import os
import resource

import pytest

from tests.cli.conftest import monarch

pytestmark = pytest.mark.timeout(300)

FLOOD = """
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(n):
    try:
        socks.append(socket.create_connection((host, port), timeout=5))
    except OSError as e:
        print("connect failed:", e, flush=True)
        break
print(len(socks), "open", flush=True)
time.sleep(120)
"""


def _login_node_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


def test_2000_idle_connections_from_another_user_do_not_silence_an_agent(attacker, tmp_path):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4096:
        pytest.skip(f"the hard descriptor limit here ({hard}) is below what 2,000 connections need")
    r = monarch("serve", cwd=tmp_path, preexec_fn=_login_node_limit)
    assert r.returncode == 0, r.stderr
    flood = None
    try:
        with open(tmp_path / ".monarch" / "jobs" / "default" / "agents" / "0.json") as f:
            addr = json.load(f)["addr"]
        host, port = addr.split("://", 1)[1].split("#")[0].rsplit(":", 1)
        flood = attacker.popen(["/usr/bin/python3", "-c", FLOOD, host, port, "2000"],
                               stdout=__import__("subprocess").PIPE, text=True)
        line = flood.stdout.readline()
        assert line.startswith("2000 open"), line
        r = monarch("run", "--", "true", cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        r = monarch("status", cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        monarch("stop", "--force", cwd=tmp_path, timeout=60)
    assert os.path.exists(tmp_path / ".monarch")
