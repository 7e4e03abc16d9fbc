"""One key per role: user code in a proc holds the proc key, which lets it do what actors need
(talk to the client and other procs, spawn procs on its own host) and no more: it cannot start
a command, open a shell or stop a host agent, on its own host or another."""

from __future__ import annotations

import os
import time

import pytest

from monarch.actor import Actor, endpoint, this_host
from monarch_agents import messages as m
from monarch_agents.keys import JobKeys
from monarch_agents.transport import PeerLost
from tests.agents.test_transport import Box
from tests.helpers import start_host_agent, wait_gone

pytestmark = pytest.mark.timeout(120)

T = 30
NOTHING_S = 1.0


def test_proc_keys_hold_no_client_or_host_secret():
    keys = JobKeys.generate()
    p = keys.for_procs()
    assert p.client_secret == "" and p.host_secret == ""
    assert p.identity == (keys.proc_public, keys.proc_secret)
    assert p.server_secret == keys.server_secret  # procs listen as members
    assert len({keys.server_public, keys.client_public, keys.host_public, keys.proc_public}) == 4


def test_host_keys_hold_no_client_secret():
    """What a pod's host agent gets (user code in the pod can read it): its own pair and the procs'."""
    keys = JobKeys.generate()
    h = keys.for_hosts()
    assert h.client_secret == "" and h.client_public == keys.client_public
    assert (h.host_secret, h.proc_secret, h.server_secret) == (keys.host_secret, keys.proc_secret, keys.server_secret)
    assert h.identity == (keys.host_public, keys.host_secret) and h.role == "host"
    assert h.for_procs() == keys.for_procs()  # and hands its procs what the client's agents do
    assert keys.for_procs().role == "proc" and keys.role == "client"


@pytest.fixture
def agent(client, tmp_path):
    a = start_host_agent(client.keys, tmp_path, hostname="roles")
    yield a
    a.stop()
    assert wait_gone([a.pid]) == []


class Asker:
    """A mailbox holding proc keys, as user code in a proc does, with a port for answers."""

    def __init__(self, keys: JobKeys):
        self.box = Box(keys.for_procs(), "proc-user")

    def ask(self, addr: str, make) -> m.Reply:
        self.box.mb.send(addr, make(m.PortRef(self.box.addr, 1)))
        while True:
            msg = self.box.received.get(timeout=T)
            if isinstance(msg, m.Reply):
                return msg

    def close(self) -> None:
        self.box.close()


def test_a_proc_key_cannot_run_a_command_or_shell_on_its_host(client, agent, tmp_path):
    """Through the Unix socket, as a proc of this host (tests/cli/test_netns.py has procs of another host)."""
    marker = tmp_path / "ran"
    asker = Asker(client.keys)
    try:
        got = asker.ask(agent.addr, lambda port: m.RunCommand("r1", ["touch", str(marker)], {}, None, port, 0, port.addr))
        assert not got.ok and isinstance(got.payload, PermissionError) and "RunCommand" in str(got.payload)
        got = asker.ask(agent.addr, lambda port: m.OpenShell("s1", ["sh"], {}, None, 24, 80, port, port.addr))
        assert not got.ok and isinstance(got.payload, PermissionError)
        asker.box.mb.send(agent.addr, m.Shutdown(None))
        # What any member may do still works: a ping answers.
        got = asker.ask(agent.addr, lambda port: m.Ping(port))
        assert got.ok and isinstance(got.payload, m.HostInfo) and got.payload.pid == agent.pid
        time.sleep(NOTHING_S)
        assert not marker.exists()
        assert agent.proc.poll() is None  # Shutdown was refused too
        # Spawning procs on its own host, as this_host() in an actor does, is allowed.
        got = asker.ask(agent.addr, lambda port: m.SpawnProcs("mesh-r", 1, port.addr, port, {}))
        assert got.ok, got.payload
        asker.box.mb.send(agent.addr, m.StopProcs("mesh-r", None))
    finally:
        asker.close()
    # The client's key still may.
    done = client.request(agent.addr, lambda port: m.Ping(port)).get(timeout=T)
    assert done.pid == agent.pid


@pytest.mark.parametrize("keys_of", ["proc", "pod"])
def test_a_fan_out_is_the_clients_alone(client, agent, tmp_path, keys_of):
    """A Fanout (a control message the agent forwards down a tree and runs itself) carries the
    client's authority: a proc's key, or a pod's host key over TCP, is refused it whatever it carries."""
    marker = tmp_path / "ran"
    keys = client.keys.for_procs() if keys_of == "proc" else client.keys.for_hosts()
    box = Box(keys, f"{keys_of}-user")
    box.mb._local_ipc = keys_of == "proc"  # a pod's key reaches the agent over TCP (see the test below)
    try:
        port = m.PortRef(box.addr, 1)
        run = m.RunCommand("r1", ["touch", str(marker)], {}, None, port, 0, box.addr)
        box.mb.send(agent.addr, m.Fanout([(0, agent.addr, "roles", run), (1, agent.addr, "roles", m.Shutdown(None))],
                                         2, None, port))
        got = box.received.get(timeout=T)
        assert isinstance(got, m.Reply) and not got.ok and "Fanout" in str(got.payload)
        time.sleep(NOTHING_S)
        assert not marker.exists() and agent.proc.poll() is None
    finally:
        box.close()
    # Nor does the client's own key make a fan-out carry what fan-outs do not carry (a shell).
    stream = client.open_stream(lambda msg: None)
    try:
        shell = m.OpenShell("s1", ["sh", "-c", f"touch {marker}"], {}, None, 24, 80, stream.ref, client.addr)
        client.send(agent.addr, m.Fanout([(0, agent.addr, "roles", shell)], 2, 5.0, stream.ref))
        time.sleep(NOTHING_S)
        assert not marker.exists()
    finally:
        stream.close()
    done = client.request(agent.addr, lambda port: m.Ping(port)).get(timeout=T)
    assert done.pid == agent.pid


@pytest.mark.parametrize("local_ipc", [True, False], ids=["ipc", "tcp"])
def test_a_pods_host_key_cannot_run_a_command_or_stop_a_host_agent(client, agent, tmp_path, local_ipc):
    """What user code in a Kubernetes pod can read (its host agent's keys, JobKeys.for_hosts) does not
    make it the client: another host agent refuses it what it refuses a proc's key."""
    marker = tmp_path / "ran"
    box = Box(client.keys.for_hosts(), "pod-user")
    # tcp: it sends over TCP, as from another pod, and keeps its Unix socket for the agent's answers
    # (an agent takes a process of its host without one for gone).
    box.mb._local_ipc = local_ipc

    def ask(make) -> m.Reply:
        box.mb.send(agent.addr, make(m.PortRef(box.addr, 1)))
        while True:
            msg = box.received.get(timeout=T)
            if isinstance(msg, m.Reply):
                return msg

    def send_refused(msg) -> None:
        # The agent ends the refused link; once this side has seen that end (the IO thread, at any
        # moment) a send says PeerLost instead of writing to it: either way nothing reaches the agent.
        try:
            box.mb.send(agent.addr, msg)
        except PeerLost:
            pass

    try:
        if local_ipc:
            # A Unix-socket hello with the host key proves nothing to a host agent: the link is refused.
            send_refused(m.RunCommand("r1", ["touch", str(marker)], {}, None, m.PortRef(box.addr, 1), 0, box.addr))
        else:
            got = ask(lambda port: m.RunCommand("r1", ["touch", str(marker)], {}, None, port, 0, port.addr))
            assert not got.ok and isinstance(got.payload, PermissionError) and "RunCommand" in str(got.payload)
            got = ask(lambda port: m.OpenShell("s1", ["sh"], {}, None, 24, 80, port, port.addr))
            assert not got.ok and isinstance(got.payload, PermissionError)
            got = ask(lambda port: m.Ping(port))  # what any member may do
            assert got.ok and got.payload.pid == agent.pid
        if local_ipc:
            send_refused(m.Shutdown(None))
        else:
            box.mb.send(agent.addr, m.Shutdown(None))
        time.sleep(NOTHING_S)
        assert not marker.exists()
        assert agent.proc.poll() is None
    finally:
        box.close()
    done = client.request(agent.addr, lambda port: m.Ping(port)).get(timeout=T)
    assert done.pid == agent.pid


def test_a_host_agent_without_the_client_secret_obeys_and_answers_the_client(client, tmp_path):
    """A pod's host agent (JobKeys.for_hosts) speaks with the host pair: the client takes its answers,
    also on a port that waits on host agents only; the client reaches it over TCP (it cannot check a
    Unix-socket hello made with the client's secret)."""
    from monarch_agents.transport import lacks_client_key

    a = start_host_agent(client.keys.for_hosts(), tmp_path, hostname="pod")
    try:
        assert lacks_client_key(a.addr)
        done = client.request(a.addr, lambda port: m.Ping(port)).get(timeout=T)
        assert done.pid == a.pid
        marker = tmp_path / "ran"
        box = Box(client.keys, "client-like")
        try:
            box.mb.send(a.addr, m.RunCommand("r1", ["touch", str(marker)], {}, None, m.PortRef(box.addr, 1), 0, box.addr))
            deadline = time.monotonic() + T
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert marker.exists()  # the client's key is obeyed
        finally:
            box.close()
    finally:
        a.stop()
    assert wait_gone([a.pid]) == []


class Intruder(Actor):
    """User code that tries to use its proc's keys to start a command on its host."""

    @endpoint
    def try_run(self, marker: str) -> dict:
        from monarch_agents import runtime
        from monarch_agents.future import Future
        from monarch_agents.runtime import OneShot

        rt = runtime.current()
        fut = Future()
        port = rt.open_port(OneShot(rt, fut))
        rt.send(os.environ["MONARCH_HOST_AGENT"], m.RunCommand("evil", ["touch", marker], {}, None, port, 0, rt.addr))
        try:
            fut.get(timeout=10)
            answer = "ran"
        except PermissionError as e:
            answer = f"refused: {e}"
        return {"client_secret": rt.keys.client_secret, "host_secret": rt.keys.host_secret, "answer": answer}


def test_user_code_in_a_proc_cannot_start_a_command_on_its_host(tmp_path):
    marker = tmp_path / "evil-ran"
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        got = procs.spawn("intruder", Intruder).try_run.call_one(str(marker)).get(timeout=T)
    finally:
        procs.stop().get(timeout=T)
    assert got["client_secret"] == "" and got["host_secret"] == ""
    assert got["answer"].startswith("refused:") and "RunCommand" in got["answer"], got
    time.sleep(NOTHING_S)
    assert not marker.exists()
