"""What a rank (user code holding only the proc key, running as the same user) can get at
(issue #24, findings 3 and 4): no answer to the client's ports, no error unpickled in full, no
host agent memory, environment or key file named on a command line."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time

import pytest

from monarch_agents import messages as m
from monarch_agents.runtime import _as_exception
from tests.agents.test_transport import Box
from tests.cli.conftest import ROOT, monarch
from tests.fixtures import client  # noqa: F401  (fixture: this process's runtime and host agent)

pytestmark = pytest.mark.timeout(180)

NOTHING_S = 1.0


class _Evil:
    """What a rank would send: unpickling it runs a command."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Port:
    port_id = 0

    def __init__(self):
        self.got: queue.Queue = queue.Queue()

    def deliver(self, reply: m.Reply) -> None:
        self.got.put(reply)

    def lost(self, addr, err) -> None:
        pass


@pytest.mark.parametrize("path", ["ipc", "tcp"])
def test_a_proc_key_cannot_answer_a_port_that_waits_on_host_agents(client, tmp_path, path):  # noqa: F811
    marker = tmp_path / "ran"
    handler = _Port()
    agent_addr = "tcp://127.0.0.1:9#h" + "0" * 12  # what `monarch status` waits on: a host agent
    port = client.open_port(handler, waits_on=(agent_addr,))
    rank = Box(client.keys.for_procs(), "rank", local_ipc=path == "ipc")
    agent = Box(client.keys, "agent-like", local_ipc=path == "ipc")  # a host agent holds the client's key
    try:
        # Even knowing the port id (they are random 63-bit numbers now), a rank's answer is dropped.
        rank.mb.send(client.addr, m.Reply(port.port_id, 0, False, m.Pickled.of(_Evil(str(marker)))))
        time.sleep(NOTHING_S)
        assert handler.got.empty()
        agent.mb.send(client.addr, m.Reply(port.port_id, 0, True, "the agent's answer"))
        assert handler.got.get(timeout=30).payload == "the agent's answer"
        assert handler.got.empty() and not marker.exists()
    finally:
        client.close_port(port.port_id)
        rank.close()
        agent.close()


def test_port_ids_are_random_63_bit(client):  # noqa: F811
    ids = [client.open_port(_Port()).port_id for _ in range(4)]
    for i in ids:
        client.close_port(i)
    assert len(set(ids)) == 4 and max(ids) > 1 << 32 and max(ids) < 1 << 63
    assert sorted(ids) != list(range(min(ids), min(ids) + 4))


def test_an_error_from_a_host_agent_port_is_never_unpickled_in_full(tmp_path):
    marker = tmp_path / "ran"
    err = _as_exception(m.Pickled.of(_Evil(str(marker))), restricted=True)
    assert isinstance(err, RuntimeError) and "could not be decoded" in str(err)
    assert not marker.exists()


def test_a_rank_finds_no_key_on_the_agents_command_line_and_cannot_read_its_memory(tmp_path):
    assert monarch("serve", cwd=tmp_path).returncode == 0
    try:
        with open(tmp_path / ".monarch" / "jobs" / "default" / "agents" / "0.json") as f:
            pid = json.load(f)["pid"]
        with open(tmp_path / ".monarch" / "job_state.pkl", "rb") as f:
            state = f.read()
        # What a rank sees of its host agent: the command line names no keys file, and no secret.
        probe = (f"import sys; c=open('/proc/{pid}/cmdline','rb').read(); "
                 f"print('keys-file' in c.decode() or 'keys.json' in c.decode())")
        r = monarch("run", "--", sys.executable, "-c", probe, cwd=tmp_path)
        assert r.returncode == 0 and "False" in r.stdout, (r.stdout, r.stderr)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        from monarch._workbench.state import load_state

        keys = load_state(str(tmp_path / ".monarch" / "job_state.pkl")).keys
        assert keys.client_secret.encode() not in cmdline and keys.client_secret.encode() in state
        # The agent is not dumpable (it says so in its address file: as root, this test cannot see it
        # from outside); test_not_dumpable_keeps_a_process_of_the_same_user_out shows what that stops.
        with open(tmp_path / ".monarch" / "jobs" / "default" / "agents" / "0.json") as f:
            assert json.load(f)["dumpable"] is False
    finally:
        monarch("stop", "--force", cwd=tmp_path, timeout=60)


_HELD = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("hardening", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
if sys.argv[2] == "1":
    assert mod.not_dumpable()
print(os.getpid(), flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("hardened", [True, False])
def test_not_dumpable_keeps_a_process_of_the_same_user_out(attacker, hardened):
    """The rule the host agent relies on, shown with two processes of one (non-root) user."""
    p = attacker.popen(["/usr/bin/python3", "-c", _HELD, os.path.join(ROOT, "monarch_agents", "hardening.py"),
                        "1" if hardened else "0"], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(p.stdout.readline())
        r = attacker.run(f"cat /proc/{pid}/environ", check=False)
        mem = attacker.run(f"dd if=/proc/{pid}/mem bs=1 count=1 skip=4096 2>&1", check=False)
        if hardened:
            assert r.returncode != 0 and "ermission denied" in r.stderr
            assert "ermission denied" in mem.stdout
        else:
            assert r.returncode == 0 and "PATH=" in r.stdout
            assert "ermission denied" not in mem.stdout
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("path", ["ipc", "tcp"])
def test_a_monarch_commands_runtime_hears_only_its_agents(client, monkeypatch, path):  # noqa: F811
    """`monarch status`, `debug`, `dashboard`, `query`... host no actor: a proc's key gets nothing in."""
    from monarch_agents import client as agents_client
    from monarch_agents import keys as keys_mod
    from monarch_agents.keys import JobKeys

    monkeypatch.setattr(keys_mod, "_agents_only", True)  # what monarch_cli.main sets
    keys = JobKeys.generate()
    rt = agents_client.ensure_runtime(keys)
    rank = Box(keys.for_procs(), "rank", local_ipc=path == "ipc")
    agent = Box(keys, "agent-like", local_ipc=path == "ipc")
    try:
        rank.mb.send(rt.addr, m.ActorDebugWaiting({"id": "x"}))
        agent.mb.send(rt.addr, m.ActorDebugWaiting({"id": "y"}))
        deadline = time.monotonic() + 30
        while rt.mailbox.stats_received + rt.mailbox.stats_refused < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (rt.mailbox.stats_refused, rt.mailbox.stats_received) == (1, 1)
    finally:
        rank.close()
        agent.close()
        rt.close()
        agents_client._by_keys.pop(keys, None)



#: An actor looking through its own process's memory (what any rank or actor can do) for a secret
#: only the client and host agents should hold.
PROBE = """
import gc, sys
from monarch.actor import Actor, endpoint
from monarch.job import job_load

class Probe(Actor):
    @endpoint
    def find(self, secrets: list) -> list:
        found = set()
        for o in gc.get_objects():
            try:
                if type(o).__name__ == "JobKeys" and (o.client_secret in secrets or o.host_secret in secrets):
                    found.add("JobKeys")
                elif type(o) is dict and any(type(v) is str and v in secrets for v in o.values()):
                    found.add("dict")
            except Exception:
                pass
        return sorted(found)

    @endpoint
    def dumpable(self) -> int:
        import ctypes

        return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE

procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 1})
probes = procs.spawn("probe", Probe)
print("found", sorted(set(sum(probes.find.call(sys.argv[1:]).get().values(), []))))
print("dumpable", sorted(set(probes.dumpable.call().get().values())))
"""


def test_a_proc_forked_from_a_host_agent_finds_no_agent_secret_and_stays_dumpable(tmp_path):
    """Local host agents are forks of one launcher, their zygotes forks of them, and each proc a fork
    of its zygote: whatever an agent held when its zygote was forked would be in every proc."""
    assert monarch("serve", "--hosts", "2", cwd=tmp_path).returncode == 0
    try:
        from monarch._workbench.state import load_state

        keys = load_state(str(tmp_path / ".monarch" / "job_state.pkl")).keys
        (tmp_path / "probe.py").write_text(PROBE)
        r = monarch("run", "probe.py", keys.client_secret, keys.host_secret, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "found []" in r.stdout, r.stdout
        # Procs stay dumpable (the agents are not): py-spy and same-host RDMA reads need that.
        assert "dumpable [1]" in r.stdout, r.stdout
    finally:
        monarch("stop", "--force", cwd=tmp_path, timeout=60)
