"""A host agent's own log (``agent.log``, its stdout and stderr) stays under its cap, newest lines kept."""

from __future__ import annotations

import os

import pytest

from monarch_agents import messages as m
from tests.helpers import start_host_agent, wait_gone

pytestmark = pytest.mark.timeout(120)

CAP = 4096


def _refuse(client, agent, n: int) -> None:
    """``n`` runs the agent refuses (rank -1 .. -n), each a warning line in its log, in order."""
    for i in range(1, n + 1):
        client.send(agent.addr, m.RunCommand(f"r{i}", ["true"], {}, None, m.PortRef("", 0), -i, client.addr))


def _wait_for(path: str, text: str, agent) -> None:
    import time

    while True:  # bounded by the test's timeout; the agent's death ends it at once
        try:
            with open(path, errors="replace") as f:
                if text in f.read():
                    return
        except FileNotFoundError:
            pass
        assert agent.proc.poll() is None, "the agent died"
        time.sleep(0.05)


def test_agent_log_is_rotated_at_its_cap_and_keeps_the_newest_lines(client, tmp_path, monkeypatch):
    monkeypatch.setenv("MONARCH_AGENT_LOG_MAX", str(CAP))
    agent = start_host_agent(client.keys, tmp_path, hostname="capped")
    log = agent.log_path
    try:
        n = 300  # ~80 bytes each: several times the cap
        _refuse(client, agent, n)
        _wait_for(log, f"refused a run with rank {-n}\n", agent)
        current = open(log, errors="replace").read()
        before = open(log + ".1", errors="replace").read()
        # Bounded: each file at most the cap and a line; nothing older than the one before.
        assert os.path.getsize(log) <= CAP + 200 and os.path.getsize(log + ".1") <= CAP + 200
        assert sorted(f for f in os.listdir(tmp_path) if f.startswith("capped-agent.log")) == \
            ["capped-agent.log", "capped-agent.log.1"]
        assert oct(os.stat(log).st_mode & 0o777) == "0o600"
        # The new file says where the lines before it are; none lost between the two files.
        first, rest = current.split("\n", 1)
        assert first.startswith("[monarch: ") and "reached its cap of 4 KiB (MONARCH_AGENT_LOG_MAX)" in first
        assert "capped-agent.log.1" in first
        ranks = [int(line.rsplit(" ", 1)[1]) for line in (before + rest).splitlines()
                 if "refused a run with rank" in line]
        assert ranks == list(range(ranks[0], -n - 1, -1)) and ranks[-1] == -n, ranks
        assert len(ranks) >= CAP // 100
        # The agent still works after rotating its log.
        _refuse(client, agent, 1)
        _wait_for(log, "refused a run with rank -1\n", agent)
    finally:
        agent.stop()
    assert wait_gone([agent.pid]) == []


def test_a_bad_cap_is_said_and_the_default_applies(client, tmp_path, monkeypatch):
    monkeypatch.setenv("MONARCH_AGENT_LOG_MAX", "lots")
    agent = start_host_agent(client.keys, tmp_path, hostname="badcap")
    try:
        _refuse(client, agent, 1)
        _wait_for(agent.log_path, "refused a run with rank -1\n", agent)
        text = open(agent.log_path).read()
        assert "MONARCH_AGENT_LOG_MAX: 'lots' is not a size (e.g. 256M, 2G, or bytes); kept 32 MiB" in text
        assert not os.path.exists(agent.log_path + ".1")
    finally:
        agent.stop()
    assert wait_gone([agent.pid]) == []
