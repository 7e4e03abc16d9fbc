"""Monarch's transport and lifetime settings applied: message_delivery_timeout (a proc that takes
none of our messages fails the call waiting on it), mesh_orphan_timeout (a dead client's procs
outlive it by that long, or until stopped) and mesh_attach_config_timeout (attach_to_workers fails
closed when a worker does not take the job).  Real procs, SIGSTOP and kill -9; the asserts are of
outcome and order, never of speed."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from monarch import config
from monarch.actor import SupervisionError, this_host
from monarch.actor import attach_to_workers
from tests.helpers import ROOT, wait_gone
from tests.monarch.actors import Worker

T = 120


@contextlib.contextmanager
def _stopped(pid: int):
    """SIGSTOP ``pid`` for the block (it reads nothing meanwhile), SIGCONT after, whatever happens.
    The block starts once the kernel shows it stopped: a signal is delivered a moment after kill()
    returns, and a message sent meanwhile may still be read."""
    os.kill(pid, signal.SIGSTOP)
    while _state(pid) != "T":
        time.sleep(0.01)
    try:
        yield
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2]


def test_message_delivery_timeout_fails_a_call_to_a_proc_that_takes_nothing():
    """A SIGSTOPped proc reads none of its messages: under "10m" the call is still waiting after
    seconds; under "1s" it fails while the proc is still stopped, naming the setting, and once the
    proc goes on, the next message reaches it (it was given up on, not dead)."""
    for limit in ("10m", "1s"):
        with config.configured(message_delivery_timeout=limit):
            pm = this_host().spawn_procs(per_host={"gpus": 1})
            try:
                w = pm.spawn("w", Worker)
                pid = w.pid.call_one().get(timeout=T)
                with _stopped(pid):
                    call = w.echo.call_one("hello")
                    if limit == "10m":
                        with pytest.raises(TimeoutError):
                            call.get(timeout=3)  # not delivered, and not given up on
                    else:
                        with pytest.raises(SupervisionError, match=r"message_delivery_timeout \(1 s\)"):
                            call.get(timeout=T)
                if limit == "10m":
                    assert call.get(timeout=T) == "hello"  # delivered once the proc runs again
                else:
                    # Given up on for reading nothing, not dead: the next message tries it afresh.
                    from monarch_agents import runtime as rt_mod
                    from monarch_agents.messages import ConfigDump

                    answer = rt_mod.current().request(pm._procs[0].addr, lambda port: ConfigDump([], port))
                    assert "env" in answer.get(timeout=T)
            finally:
                pm.stop().get(timeout=T)


_CLIENT = textwrap.dedent('''
    import json, sys, time
    from monarch import config
    from monarch.job import ProcessJob
    from tests.monarch.actors import Worker

    config.configure(mesh_orphan_timeout=None if sys.argv[1] == "None" else sys.argv[1])
    state = ProcessJob({"hosts": 1}).state()
    pm = state.hosts.spawn_procs(per_host={"gpus": 2})
    print(json.dumps(sorted(pm.spawn("w", Worker).pid.call().get(timeout=60).values())), flush=True)
    time.sleep(600)
''')


def _orphans(cwd, limit: str) -> list[int]:
    """Start a client of the reservation in ``cwd`` under ``mesh_orphan_timeout=limit``, kill -9 it
    once its procs run; their pids."""
    p = subprocess.Popen([sys.executable, "-c", _CLIENT, limit], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        ready, _, _ = select.select([p.stdout], [], [], T)
        line = p.stdout.readline() if ready else ""
        assert line, f"the client did not report its procs: {p.stderr.read() if p.poll() is not None else ''}"
        pids = json.loads(line)
        assert wait_gone(pids, 0) == pids  # running
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
    return pids


@pytest.fixture
def served(tmp_path):
    from tests.cli.conftest import monarch

    assert monarch("serve", "--hosts", "1", cwd=tmp_path).returncode == 0
    yield tmp_path
    monarch("stop", "--force", cwd=tmp_path)


def test_mesh_orphan_timeout_keeps_a_dead_clients_procs_that_long(served):
    """kill -9 of a client of a reservation: under "8s" its procs are still there when it is gone,
    then reaped by their host; under None they stay until the reservation stops."""
    from tests.cli.conftest import monarch

    pids = _orphans(served, "8s")
    assert wait_gone(pids, 0) == pids  # the client is dead; its procs are not (yet)
    assert wait_gone(pids, T) == []  # ... and then they are, its host still up
    kept = _orphans(served, "None")
    assert wait_gone(kept, 3) == kept  # none reaped
    assert monarch("stop", cwd=served).returncode == 0
    assert wait_gone(kept, T) == []


def test_mesh_attach_config_timeout_fails_the_attach_closed():
    """A "worker" that accepts the connection but never takes the job: the attach gives up after
    mesh_attach_config_timeout, naming it, while the worker still holds the connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(T)
        try:
            held.append(listener.accept()[0])  # and never answer
        except OSError:
            pass
        done.wait(T)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        with config.configured(mesh_attach_config_timeout="1s"):
            # As in Monarch, attach_to_workers returns; the mesh's `initialized` raises why.
            hosts = attach_to_workers(ca="trust_all_connections",
                                      workers=[f"tcp://127.0.0.1:{listener.getsockname()[1]}"])
            with pytest.raises(RuntimeError, match=r"(?s)attach failed: config push failed during attach.*"
                                                   r"mesh_attach_config_timeout \(1 s\)") as failed:
                hosts.initialized.get()
            assert isinstance(failed.value.__cause__, TimeoutError)
        assert held and held[0].fileno() >= 0  # it failed while the worker still held on
    finally:
        done.set()
        t.join(T)
        for s in held:
            s.close()
        listener.close()


def test_an_attach_to_something_that_is_no_worker_fails_in_one_line_and_closes_its_connection():
    """A listener that answers a line that is not a worker's: the attach fails saying so (not a JSON
    parser's message), and closes its end (the listener reads EOF)."""
    listener = socket.create_server(("127.0.0.1", 0))
    eof = threading.Event()

    def answer() -> None:
        listener.settimeout(T)
        try:
            conn = listener.accept()[0]
        except OSError:
            return
        with conn:
            conn.settimeout(T)
            conn.makefile("rb").readline()
            conn.sendall(b"HTTP/1.0 400 Bad Request\n")
            try:
                while conn.recv(4096):
                    pass
                eof.set()
            except OSError:
                pass

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        hosts = attach_to_workers(ca="trust_all_connections",
                                  workers=[f"tcp://127.0.0.1:{listener.getsockname()[1]}"])
        with pytest.raises(RuntimeError, match=r"did not answer as a monarch worker does") as failed:
            hosts.initialized.get()
        assert "Expecting value" not in str(failed.value)
        assert eof.wait(T), "the attach left its connection open"
    finally:
        t.join(T)
        listener.close()


_SUSPENDED = textwrap.dedent('''
    import time
    from monarch import config
    from monarch.actor import Actor, endpoint, this_host

    class Slow(Actor):
        @endpoint
        def echo(self, value: str, after_s: float) -> str:
            time.sleep(after_s)
            return value

    if __name__ == "__main__":
        config.configure(message_delivery_timeout="1s")
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        w = pm.spawn("w", Slow)
        w.echo.call_one("up", 0).get(timeout=60)
        call = w.echo.call_one("answered", 2.0)
        print("sent", flush=True)
        print(call.get(timeout=120), flush=True)
        try:  # and the proc still answers it
            print(w.echo.call_one("again", 0).get(timeout=60), flush=True)
        except Exception as e:
            print(type(e).__name__, e, flush=True)
        pm.stop().get(timeout=60)
''')


def test_a_proc_waits_for_its_owner_that_stopped_reading(tmp_path):
    """A client suspended (SIGSTOP, as Ctrl-Z) while its proc answers it: the proc does not give up on
    its owner after message_delivery_timeout: the answer arrives once the client goes on, and so do
    the next ones."""
    script = tmp_path / "suspended.py"
    script.write_text(_SUSPENDED)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT}, cwd=tmp_path)
    try:
        ready, _, _ = select.select([p.stdout], [], [], T)
        assert ready and p.stdout.readline() == "sent\n", p.stderr.read() if p.poll() is not None else ""
        with _stopped(p.pid):
            time.sleep(5)  # the proc answers meanwhile, and its 1 s timeout passes several times over
        out, err = p.communicate(timeout=T)
        assert out == "answered\nagain\n", err[-2000:]
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
