"""Failures: procs killed mid-call, procs that exit, owners that supervise, hosts and clients that die.

No test asserts how fast a failure is noticed (machines differ); the times are printed
(``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import monarch.actor
from monarch.actor import ActorError, Channel, MeshFailure, SupervisionError, this_host
from monarch_rdmafs.location import default_workspace_root
from tests.helpers import ROOT, start_host_agent, wait_gone
from tests.monarch.actors import Owner, Worker

pytestmark = pytest.mark.timeout(60)

T = 30
QUIET_S = 0.2  # how long to watch for a failure report that must not come


@pytest.fixture
def faults(monkeypatch):
    """Failures this client is told about (its unhandled_fault_hook), instead of a line on stderr."""
    q: queue.Queue = queue.Queue()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", q.put)
    return q


def _no_more(q: queue.Queue) -> None:
    with pytest.raises(queue.Empty):
        q.get(timeout=QUIET_S)


def test_kill9_mid_call(faults):
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        w = pm.spawn("sup", Worker)
        pids = w.pid.call().get(timeout=T).values()
        pending = w.hold.call()  # every rank holds its answer: the call is in flight everywhere
        assert w.slice(gpus=2).pid.call_one().get(timeout=T) == pids[2]  # so rank 2 is inside it now
        t0 = time.monotonic()
        os.kill(pids[2], signal.SIGKILL)
        with pytest.raises(SupervisionError) as ei:
            pending.get(timeout=T)
        print(f"\nkill -9 of a proc noticed by the pending call after {(time.monotonic() - t0) * 1000:.1f} ms")
        e = ei.value
        text = str(e)
        assert "sup.hold" in text and "rank 2" in text and "SIGKILL" in text, text
        assert e.host and e.host in text
        assert e.rank == 2 and e.exit_code == -signal.SIGKILL
        # Later calls fail the same way, at once ...
        with pytest.raises(SupervisionError, match="SIGKILL") as later:
            w.slice(gpus=2).pid.call_one().get(timeout=T)
        assert "rank 2" in str(later.value) and e.host in str(later.value)
        with pytest.raises(SupervisionError, match="SIGKILL"):
            w.pid.call().get(timeout=T)
        with pytest.raises(SupervisionError):
            pm.spawn("late", Worker)
        # ... while the healthy ranks keep working.
        assert [w.slice(gpus=g).pid.call_one().get(timeout=T) for g in (0, 1, 3)] == [pids[0], pids[1], pids[3]]
        assert w.slice(gpus=slice(0, 2)).add.call(1, 1).get(timeout=T).values() == [2, 2]
        # The client (the mesh's owner) was told once, about rank 2.
        failure = faults.get(timeout=T)
        assert isinstance(failure, MeshFailure)
        assert failure.rank == 2 and "SIGKILL" in failure.reason and failure.exit_code == -signal.SIGKILL
        _no_more(faults)
    finally:
        pm.stop().get(timeout=T)
    assert wait_gone(pids) == []


def test_exit_inside_an_endpoint(faults):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        w = pm.spawn("quitter", Worker)
        pids = w.pid.call().get(timeout=T).values()
        t0 = time.monotonic()
        with pytest.raises(SupervisionError) as ei:
            w.slice(gpus=1).exit.call_one(3).get(timeout=T)
        print(f"\nos._exit(3) noticed after {(time.monotonic() - t0) * 1000:.1f} ms")
        assert "exited with code 3" in str(ei.value) and ei.value.exit_code == 3
        assert "quitter.exit" in str(ei.value) and "rank 1" in str(ei.value)
        with pytest.raises(SupervisionError, match="code 3"):
            w.slice(gpus=1).pid.call_one().get(timeout=T)
        assert w.slice(gpus=0).pid.call_one().get(timeout=T) == pids[0]
        failure = faults.get(timeout=T)
        assert (failure.rank, failure.exit_code) == (1, 3)
        _no_more(faults)
    finally:
        pm.stop().get(timeout=T)
    assert wait_gone(pids) == []


def test_a_dead_proc_fails_each_actor_mesh_on_it(faults):
    # As in Monarch, the owner hears once per actor mesh of its own that ran there, under that
    # mesh's name and rank; a stopped mesh is not news, and a proc that ran none of its actor
    # meshes fails as the proc mesh.
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    bare = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        alpha = pm.spawn("alpha", Worker)
        beta = pm.slice(gpus=1).spawn("beta", Worker)
        gone = pm.spawn("gone", Worker)
        pids = alpha.pid.call().get(timeout=T).values()
        beta.initialized.get(timeout=T)
        gone.stop().get(timeout=T)
        os.kill(pids[1], signal.SIGKILL)
        heard = sorted([faults.get(timeout=T), faults.get(timeout=T)], key=lambda f: f.mesh_name)
        assert [(f.mesh_name, f.rank, f.exit_code) for f in heard] == [("alpha", 1, -9), ("beta", 0, -9)]
        assert "Worker alpha{'gpus': 1/2}>" in heard[0].report() and "Worker beta>" in heard[1].report()
        _no_more(faults)
        with pytest.raises(SupervisionError) as later:  # refused here: it names the actor as Monarch does
            alpha.pid.call().get(timeout=T)
        assert str(later.value).startswith("Endpoint call alpha.pid() failed, The actor <root>.<tests.monarch.actors"
                                           ".Worker alpha{'gpus': 1/2}> and all its descendants have failed:"), later.value
        bare_pid = bare._procs[0].pid
        os.kill(bare_pid, signal.SIGKILL)
        failure = faults.get(timeout=T)
        assert (failure.mesh_name, failure.rank, failure.exit_code) == (bare._name, 0, -9)
        _no_more(faults)
    finally:
        pm.stop().get(timeout=T)
        bare.stop().get(timeout=T)
    assert wait_gone(pids) == []


def test_owner_supervises_each_failed_rank_once(faults):
    port, recv = Channel.open()
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = pm.spawn("owner", Owner, port, True)
        kids = owner.start.call_one(3).get(timeout=T)
        os.kill(kids[0], signal.SIGKILL)
        os.kill(kids[2], signal.SIGKILL)
        reports = sorted([recv.recv().get(timeout=T), recv.recv().get(timeout=T)], key=lambda r: r[1])
        assert [(r[0], r[1], r[3]) for r in reports] == [("kids", 0, -9), ("kids", 2, -9)]
        assert all("SIGKILL" in r[2] for r in reports)
        # Messages to the owner come after its __supervise__ calls (one mailbox): exactly two.
        assert sorted(owner.failures_seen.call_one().get(timeout=T)) == [("kids", 0, -9), ("kids", 2, -9)]
        with pytest.raises(TimeoutError):
            recv.recv().get(timeout=QUIET_S)
        # __supervise__ returned True: the owner is healthy, and so is the kid that was not killed.
        assert owner.ping.call_one().get(timeout=T) == "pong"
        assert owner.ask_kid.call_one(1, 41).get(timeout=T) == 42
        with pytest.raises(ActorError, match="SupervisionError"):
            owner.ask_kid.call_one(0, 1).get(timeout=T)
        _no_more(faults)  # handled by the owner: nothing reaches the client
        owner.stop_kids.call_one().get(timeout=T)
    finally:
        pm.stop().get(timeout=T)
    assert wait_gone(kids) == []


def test_owner_that_does_not_handle_a_failure_fails(faults):
    port, recv = Channel.open()
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = pm.spawn("careless", Owner, port, False)
        kids = owner.start.call_one(1).get(timeout=T)
        os.kill(kids[0], signal.SIGKILL)
        assert recv.recv().get(timeout=T)[1] == 0  # __supervise__ ran, and returned False
        failure = faults.get(timeout=T)  # so the failure goes up, to the client
        assert failure.mesh_name == "careless" and "unhandled failure" in failure.reason
        with pytest.raises(SupervisionError, match="careless"):
            owner.ping.call_one().get(timeout=T)
        _no_more(faults)
    finally:
        pm.stop().get(timeout=T)
    assert wait_gone(kids) == []


def test_exception_with_no_caller_fails_the_actor(faults):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        w = pm.spawn("loud", Worker)
        bystander = pm.spawn("bystander", Worker)
        bystander.initialized.get(timeout=T)
        w.fail.broadcast("nobody listens")
        got = sorted(faults.get(timeout=T).rank for _ in range(2))
        assert got == [0, 1]
        with pytest.raises(SupervisionError, match="nobody listens"):
            w.add.call(1).get(timeout=T)
        # The actors already on the procs go on; as in Monarch the procs take no new actor.
        assert bystander.add.call(1, 2).get(timeout=T).values() == [3, 3]
        with pytest.raises(RuntimeError, match="Cannot spawn new actors on mesh with supervision events"):
            pm.spawn("quiet", Worker).initialized.get(timeout=T)
    finally:
        pm.stop().get(timeout=T)


def test_the_suite_records_a_failure_its_test_leaves_to_the_default(recorded_faults):
    # No hook of this test's own: the default one would end the client (pytest) with a KeyboardInterrupt;
    # tests/conftest.py's recorder takes the failure instead, and the session goes on.
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        w = pm.spawn("unwatched", Worker)
        w.initialized.get(timeout=T)
        w.fail.broadcast("left to the suite's hook")
        deadline = time.monotonic() + T
        while not recorded_faults() and time.monotonic() < deadline:
            time.sleep(0.05)
        [failure] = recorded_faults()
        assert failure.mesh_name == "unwatched" and "left to the suite's hook" in failure.report()
    finally:
        pm.stop().get(timeout=T)


def test_kill9_of_the_host_agent(client, tmp_path, faults):
    agent = start_host_agent(client.keys, tmp_path, hostname="doomed")
    pm = agent.host_mesh().spawn_procs(per_host={"gpus": 2})
    w = pm.spawn("stranded", Worker)
    pids = w.pid.call().get(timeout=T).values()
    pending = w.hold.call()
    assert w.pid.call().get(timeout=T).values() == pids  # the held call reached both ranks
    family = agent.children()  # the zygote and the procs
    assert set(pids) <= set(family)
    t0 = time.monotonic()
    os.kill(agent.pid, signal.SIGKILL)
    with pytest.raises(SupervisionError) as ei:
        pending.get(timeout=T)
    print(f"\nkill -9 of the host agent noticed after {(time.monotonic() - t0) * 1000:.1f} ms")
    assert "stranded.hold" in str(ei.value)
    with pytest.raises(SupervisionError):
        w.pid.call().get(timeout=T)
    assert agent.proc.wait(timeout=T) == -signal.SIGKILL
    assert wait_gone(family) == []
    assert sorted(faults.get(timeout=T).rank for _ in pids) == [0, 1]
    pm.stop().get(timeout=T)  # stopping what is already gone is fine
    # It never received a workspace, so it made no store in the host's temp dir that nobody would remove.
    assert not os.path.exists(default_workspace_root(agent.info["log_dir"]))


CLIENT = textwrap.dedent('''
    import json, os, sys, time
    from monarch.actor import Actor, endpoint, this_host
    from monarch.actor import _client

    class Ids(Actor):
        @endpoint
        def ids(self):
            return os.getpid(), os.getppid()

    if __name__ == "__main__":
        procs = this_host().spawn_procs(per_host={"gpus": 3})
        ids = procs.spawn("ids", Ids).ids.call().get(timeout=30).values()
        print(json.dumps({"procs": [i[0] for i in ids], "zygote": ids[0][1], "agent": _client._local_proc.pid}),
              flush=True)
        time.sleep(300)
''')


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the client script did not report its procs"
    return proc.stdout.readline()


def test_client_killed_with_sigkill_has_its_procs_reaped(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=ROOT)
    try:
        line = _read_line(proc, T)
        assert line, "the client script exited early"
        info = json.loads(line)
        doomed = [*info["procs"], info["zygote"], info["agent"]]
        assert len(set(info["procs"])) == 3 and wait_gone(doomed, 0) == doomed  # all running
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=T)
        left = wait_gone(doomed, 5.0)
        print(f"\nprocs of a kill -9'd client reaped after {(time.monotonic() - t0) * 1000:.1f} ms")
        assert left == [], f"still running after the client died: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _Victim(Worker):
    pass


class _MakesMeshesFromAThread(Worker):
    """Makes a proc mesh from a thread of its own: outside any actor's context, so no actor owns it and
    its failure goes to the proc's unhandled_fault_hook (the default one)."""

    def _in_thread(self, fn):
        import threading

        out: list = []
        t = threading.Thread(target=lambda: out.append(_outcome(fn)))
        t.start()
        t.join(T)
        ok, value = out[0]
        if not ok:
            raise value
        return value

    @monarch.actor.endpoint
    def make_victim(self) -> int:
        def make():
            self.victims = this_host().spawn_procs(per_host={"gpus": 1})
            self.victim = self.victims.spawn("unowned_victim", _Victim)
            return self.victim.pid.call_one().get(timeout=T)
        return self._in_thread(make)

    @monarch.actor.endpoint
    def victim_failure(self) -> str:
        def wait():
            deadline = time.monotonic() + T
            while time.monotonic() < deadline:
                try:
                    self.victim.pid.call_one().get(timeout=T)
                except SupervisionError as e:
                    return str(e)
                time.sleep(0.05)
            return "no failure"
        return self._in_thread(wait)


def _outcome(fn):
    try:
        return True, fn()
    except BaseException as e:  # noqa: BLE001 - handed back to the endpoint's thread
        return False, e


def test_an_unowned_meshs_failure_in_a_proc_does_not_end_that_proc(recorded_faults):
    # As on torchmonarch 0.7.0: the default hook ends the client, not a proc (a proc that ended
    # would take its actors, and with them the client's calls, along).
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        parent = pm.spawn("unowned_parent", _MakesMeshesFromAThread)
        parent_pid = parent.pid.call_one().get(timeout=T)
        victim_pid = parent.make_victim.call_one().get(timeout=T)
        os.kill(victim_pid, signal.SIGKILL)
        assert "unowned_victim" in parent.victim_failure.call_one().get(timeout=T)
        assert parent.pid.call_one().get(timeout=T) == parent_pid
        assert parent.pid.call_one().get(timeout=T) == parent_pid
        assert not recorded_faults()  # its proc lives: nothing of it reached the client
    finally:
        pm.stop().get(timeout=T)
