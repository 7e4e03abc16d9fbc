"""Silencing an agent without a key (issue #24, finding 5): another local user opens 2,000 idle
connections to a host agent; the victim's commands still get answers.

A local host's agent has no TCP port at all: it listens on its Unix socket only, which checks the
peer's uid before anything is read (another user's connections are closed as they come). An agent
that listens on TCP (Slurm, `--netns`, pods) raises its soft descriptor limit to the hard one and
closes connections that have not proved a key within a few seconds (``ZMQ_HANDSHAKE_IVL``). Both are
started with the usual soft limit of 1,024 descriptors (a login node's), which a flood used to
exhaust."""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

from monarch_agents import messages as m
from tests.agents.test_transport import Box
from tests.cli.conftest import monarch
from tests.fixtures import client  # noqa: F401  (fixture: this process's runtime and host agent)
from tests.helpers import start_host_agent, wait_gone

pytestmark = pytest.mark.timeout(300)

FLOOD = """
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
socks = []
for _ in range(n):
    try:
        if host == "unix":  # an abstract Unix socket: its name follows a NUL
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(chr(0) + port)
            socks.append(s)
        else:
            socks.append(socket.create_connection((host, int(port)), timeout=5))
    except OSError as e:
        print("connect failed:", e, flush=True)
        break
print(len(socks), "open", flush=True)
time.sleep(120)
"""


def _login_node_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


def _tcp_listeners(pid: int) -> list[str]:
    """The local addresses ``pid`` listens on over TCP (from /proc: its sockets' inodes in LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    found.append(cols[1])
    return found


def test_a_local_hosts_agent_has_no_tcp_port_and_a_unix_socket_flood_does_not_silence_it(attacker, tmp_path):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4096:
        pytest.skip(f"the hard descriptor limit here ({hard}) is below what 2,000 connections need")
    r = monarch("serve", cwd=tmp_path, preexec_fn=_login_node_limit)
    assert r.returncode == 0, r.stderr
    flood = None
    try:
        with open(tmp_path / ".monarch" / "jobs" / "default" / "agents" / "0.json") as f:
            info = json.load(f)
        addr = info["addr"]
        assert addr.split("#")[0].endswith(":0"), addr  # no port to name
        assert _tcp_listeners(info["pid"]) == []
        from monarch_agents.ipc import socket_name

        flood = attacker.popen(["/usr/bin/python3", "-c", FLOOD, "unix", socket_name(addr).lstrip("\0"), "2000"],
                               stdout=__import__("subprocess").PIPE, text=True)
        line = flood.stdout.readline()
        assert "open" in line or "connect failed" in line, line
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


def _answers_over_tcp(keys, agent) -> None:
    """The agent answers a Ping from a process that reaches it over TCP, as a client on another machine does."""
    box = Box(keys, "far-client")
    box.mb._local_ipc = False
    try:
        box.mb.send(agent.addr, m.Ping(m.PortRef(box.addr, 1)))
        got = box.received.get(timeout=120)
        assert isinstance(got, m.Reply) and got.ok and got.payload.pid == agent.pid
    finally:
        box.close()


def test_2000_idle_tcp_connections_from_another_user_do_not_silence_a_tcp_agent(attacker, client, tmp_path):  # noqa: F811
    """A host agent that listens on TCP (as on Slurm or in a pod), under a login node's limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4096:
        pytest.skip(f"the hard descriptor limit here ({hard}) is below what 2,000 connections need")
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    _login_node_limit()
    try:
        agent = start_host_agent(client.keys, tmp_path, hostname="flooded")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    flood = None
    try:
        host, port = agent.addr.split("://", 1)[1].split("#")[0].rsplit(":", 1)
        assert _tcp_listeners(agent.pid)
        flood = attacker.popen(["/usr/bin/python3", "-c", FLOOD, host, port, "2000"],
                               stdout=__import__("subprocess").PIPE, text=True)
        line = flood.stdout.readline()
        assert line.startswith("2000 open"), line
        _answers_over_tcp(client.keys, agent)
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        agent.stop()
    assert wait_gone([agent.pid]) == []


#: Run as another user: open N connections to HOST PORT, then report once the agent has closed them all.
HOLD = """
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = [socket.create_connection((host, port), timeout=60) for _ in range(n)]
print(len(socks), "open", flush=True)
closed = 0
for s in socks:
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    closed += 1
print(closed, "closed", flush=True)
"""


def test_another_users_connections_to_a_tcp_agent_are_shut_before_any_handshake(attacker, client, tmp_path):  # noqa: F811
    """ZeroMQ would hold each for its handshake's deadline (3 s): time enough for another user to make
    the agent hold as many descriptors as they open connections meanwhile.  The agent tells another
    local user's connection by the kernel's tables as it is accepted and shuts it at once; its own
    job's peers are served."""
    agent = start_host_agent(client.keys, tmp_path, hostname="strangers")
    flood = None
    try:
        host, port = agent.addr.split("://", 1)[1].split("#")[0].rsplit(":", 1)
        flood = attacker.popen(["/usr/bin/python3", "-c", HOLD, host, port, "300"],
                               stdout=__import__("subprocess").PIPE, text=True)
        assert flood.stdout.readline() == "300 open\n"
        assert flood.stdout.readline() == "300 closed\n"
        # The agent shut them itself (ZeroMQ's deadline would close them too, later, and say nothing).
        with open(agent.log_path) as f:
            while "connection(s) from another user's process, before any handshake" not in f.read():
                time.sleep(0.1)
                f.seek(0)
        _answers_over_tcp(client.keys, agent)
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        agent.stop()
    assert wait_gone([agent.pid]) == []
