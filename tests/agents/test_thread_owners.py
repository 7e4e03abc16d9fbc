"""Threads with an owner that stops them by a deadline (the README's "Threads" table): a proc's actor
threads (``ProcAgent.stop``, ``ActorSlot.stop``) and the Kubernetes port-forward's (``Forwarder.stop``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers import ROOT

ACTORS = r"""
import sys, threading, time
from monarch.actor import Actor, endpoint, this_proc
from monarch_agents.proc_agent import current_agent

release, entered = threading.Event(), threading.Event()
cleaned = []
# The actors run in this process (this_proc()), but their classes travel pickled: they find these
# two through the module, not as globals pickled with them (a lock cannot be pickled).
here = lambda: sys.modules["__main__"]

class Sync(Actor):
    @endpoint
    def ping(self):
        return "sync"
    def __cleanup__(self, exc):
        here().cleaned.append("sync")

class Async(Actor):
    @endpoint
    async def ping(self):
        return "async"
    async def __cleanup__(self, exc):
        here().cleaned.append("async")

class Stuck(Actor):
    @endpoint
    def wait(self):
        here().entered.set()
        here().release.wait()
        return "released"

s, a, k = this_proc().spawn("s", Sync), this_proc().spawn("a", Async), this_proc().spawn("k", Stuck)
print(s.ping.call_one().get(timeout=60), a.ping.call_one().get(timeout=60), flush=True)
stuck = k.wait.call_one()
assert entered.wait(60)  # in user code now: a stop posted from here on waits behind it
names = lambda: sorted(t.name for t in threading.enumerate() if t.name.startswith("actor-"))
print("BEFORE", names(), flush=True)
late = current_agent().stop(time.monotonic() + 1.0)
print("LATE", late, flush=True)
print("AFTER", names(), sorted(cleaned), flush=True)
release.set()
deadline = time.monotonic() + 30
while names() and time.monotonic() < deadline:
    time.sleep(0.05)
print("END", names(), flush=True)
"""


def _line(out: str, tag: str):
    line = [x for x in out.splitlines() if x.startswith(tag + " ")]
    assert line, out
    return eval(line[-1][len(tag) + 1:])


def test_a_proc_stops_its_actors_and_joins_their_threads_by_one_deadline(tmp_path):
    (tmp_path / "prog.py").write_text(ACTORS)
    env = {**os.environ, "MONARCH_SHARED_AGENT": "0", "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _line(r.stdout, "BEFORE") == ["actor-a", "actor-k", "actor-s"]  # an async actor: one thread (no pump)
    assert _line(r.stdout, "LATE") == ["k[0]"]  # hung in user code: named, not waited for past the deadline
    after = [x for x in r.stdout.splitlines() if x.startswith("AFTER ")][-1]
    assert after == "AFTER ['actor-k'] ['async', 'sync']", r.stdout  # the others ran __cleanup__ and ended
    assert _line(r.stdout, "END") == []  # and the stuck one once its call returned


# -- the Kubernetes port-forward --------------------------------------------------------------


@pytest.fixture
def forwarder(tmp_path):
    """A Forwarder of a reservation whose API server is not there: its listeners and threads are real
    (what stop() owns); nothing here reaches the cluster."""
    pytest.importorskip("kubernetes")
    from monarch_agents.keys import JobKeys
    from monarch_schedulers.kube_forward import Forwarder

    job = tmp_path / "job"
    job.mkdir(mode=0o700)
    (job / "keys.json").write_text(json.dumps(JobKeys.generate().as_dict()))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "down",
        "clusters": [{"name": "down", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "down", "context": {"cluster": "down", "user": "u"}}]}))
    fw = Forwarder(str(job), "mesh", "default", 26600, str(kubeconfig))
    yield fw
    fw.stop(time.monotonic() + 5)


def test_the_port_forward_stops_its_listeners_and_connections_by_a_deadline(forwarder, tmp_path):
    fw = forwarder
    socks = socket.create_server(("127.0.0.1", 0))
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(str(tmp_path / "c.sock"))
    control.listen(8)
    fw.start(socks, control)
    # Connections in the middle of their handshake: a SOCKS client that said nothing yet (its handler
    # gives up after 10 s by itself), a relay client that never sends its request line (its handler
    # would wait for it as long as the connection lives).
    waiting = [socket.create_connection(socks.getsockname()), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)]
    waiting[1].connect(str(tmp_path / "c.sock"))
    # Both accepted, each by a handler of its own (an accept loop and its handlers share a name): a
    # connection still in the listen queue when stop() closes the listener is reset, not closed.
    deadline = time.monotonic() + 60
    while True:
        names = sorted(t.name for t in fw.threads())
        if names.count("relay-client") >= 2 and names.count("socks") >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert names.count("relay-client") == 2 and names.count("socks") == 2, names
    late = fw.stop(time.monotonic() + 5)
    assert late == [] and [t for t in fw.threads() if t.is_alive()] == []
    for c in waiting:  # their connections were closed, not left open
        c.settimeout(5)
        assert c.recv(1) == b""
        c.close()
    assert fw.stop(time.monotonic() + 1) == []  # again: nothing to do
    assert threading.active_count() >= 1


def test_a_closed_runtimes_own_context_ends_by_a_deadline_with_a_socket_left_open():
    """A client's second runtime ends its own ZeroMQ context in the background (``zmq-term``): a
    socket of that context still open (a sender racing the close) held ``term()``, and the thread,
    forever; now it is closed at the deadline and the thread ends."""
    import zmq

    from monarch_agents import transport
    from monarch_agents.keys import JobKeys
    from monarch_agents.runtime import Runtime

    ctx = transport.new_context()
    rt = Runtime(JobKeys.generate(), ctx=ctx).start()
    held = ctx.socket(zmq.DEALER)
    held.connect("tcp://127.0.0.1:9")  # queued, never sent: nobody listens there
    held.send(b"pending", zmq.NOBLOCK)
    before = {t for t in threading.enumerate() if t.name == "zmq-term"}
    rt.close()
    term = [t for t in threading.enumerate() if t.name == "zmq-term" and t not in before]
    assert len(term) == 1
    term[0].join(120)  # a hang bound only: it ends about 2 s after the close
    assert not term[0].is_alive()
    assert held.closed and ctx.closed


def test_the_port_forward_beats_on_a_relay_control_stream_until_its_client_ends(forwarder, monkeypatch):
    """The relay takes a control stream silent for 4 beats as a vanished client: the port-forward
    sends a byte every beat while its client is connected, and stops when the client's address ends."""
    from monarch_agents import tunnel

    monkeypatch.setattr(tunnel, "HEARTBEAT_S", 0.05)
    mine, relay = socket.socketpair()
    done = threading.Event()
    beating = threading.Thread(target=forwarder._heartbeat, args=(mine, done))
    beating.start()
    try:
        relay.settimeout(60)
        assert relay.recv(1) == b"\n" and relay.recv(1) == b"\n"
    finally:
        done.set()
        beating.join(60)
        mine.close()
        relay.close()
    assert not beating.is_alive()
