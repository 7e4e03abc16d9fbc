"""PyTorch Monarch's actor semantics, point by point (issue 12).

Each test is written from Monarch 0.7.0's documented behaviour: non-blocking spawn,
what kills an actor, where supervision events go and in which order, identity,
lifecycle, the helpers its cookbook uses, and its error texts (ours follow them).
"""

from __future__ import annotations

import os
import queue
import signal
import time

import pytest

import monarch.actor
from monarch.actor import (
    Accumulator,
    ActorError,
    Channel,
    MeshFailure,
    SupervisionError,
    ValueMesh,
    as_endpoint,
    concurrent_endpoint,
    current_actor_name,
    endpoint,
    get_or_spawn_controller,
    this_host,
    this_proc,
)
from tests.helpers import wait_gone
from tests.monarch.actors import (
    BadInit,
    Canceller,
    ControllerUser,
    Counter,
    Finalizable,
    Foreman,
    Mortal,
    GatedInit,
    Worker,
)

pytestmark = pytest.mark.timeout(90)

T = 30
QUIET_S = 0.3  # how long to watch for a report that must not come


@pytest.fixture
def faults(monkeypatch):
    """Failures that reach this client (its unhandled_fault_hook)."""
    q: queue.Queue = queue.Queue()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", q.put)
    return q


@pytest.fixture
def procs():
    # One mesh per test: as in Monarch, a proc where an actor failed takes no new actor, and
    # most tests here fail one on purpose.
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=T)


def _no_more(q: queue.Queue) -> None:
    with pytest.raises(queue.Empty):
        q.get(timeout=QUIET_S)


# --- spawn -------------------------------------------------------------------------


def test_spawn_returns_at_once_and_calls_queue_behind_init(procs, tmp_path):
    gate = tmp_path / "gate"
    slow = procs.spawn("slow", GatedInit, str(gate))  # returns while every __init__ waits for the gate
    answer = slow.ready.call()
    with pytest.raises(TimeoutError):
        slow.initialized.get(timeout=QUIET_S)
    assert not answer.done()
    gate.touch()
    assert answer.get(timeout=T).values() == [True, True]
    assert slow.initialized.get(timeout=T) is None
    slow.stop().get(timeout=T)


def test_init_failure_is_a_supervision_event_and_later_calls_raise(procs, faults):
    bad = procs.spawn("bad_one", BadInit, 1)  # returns: the failure comes as supervision
    failure = faults.get(timeout=T)
    assert isinstance(failure, MeshFailure) and failure.mesh_name == "bad_one" and failure.rank == 1
    report = failure.report()
    # Monarch names the actor as its instance: <creator>.<module.Class mesh{point}>.
    assert "The actor <root>.<tests.monarch.actors.BadInit bad_one{'gpus': 1/2}> and all its descendants have failed" in report
    assert "Actor call bad_one.__init__ failed." in report and "cannot start rank 1" in report
    _no_more(faults)
    with pytest.raises(SupervisionError) as ei:
        bad.slice(gpus=1).ok.call_one().get(timeout=T)
    text = str(ei.value)
    assert text.startswith("Endpoint call bad_one.ok() failed, The actor <root>.<tests.monarch.actors.BadInit "
                           "bad_one{'gpus': 1/2}> and all its descendants have failed:")
    assert "cannot start rank 1" in text and "BadInit" in text
    with pytest.raises(SupervisionError, match="error spawning actor mesh 'bad_one': The actor <root>.<tests.monarch.actors.BadInit bad_one.'gpus': 1/2.> and all"):
        bad.initialized.get(timeout=T)
    assert bad.slice(gpus=0).ok.call_one().get(timeout=T) is True  # rank 0 started fine
    bad.stop().get(timeout=T)
    # As in Monarch, the proc where __init__ failed is poisoned for good; the other takes new actors.
    with pytest.raises(RuntimeError, match="error spawning actor mesh 'good'.*Cannot spawn new actors on mesh "
                                           "with supervision events"):
        procs.spawn("good", BadInit, 99).ok.call().get(timeout=T)
    assert procs.slice(gpus=0).spawn("good0", BadInit, 99).ok.call().get(timeout=T).values() == [True]


def test_init_that_never_returns_does_not_block_the_client(faults, tmp_path):
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        stuck = pm.spawn("stuck", GatedInit, str(tmp_path / "never"))
        with pytest.raises(TimeoutError):
            stuck.initialized.get(timeout=QUIET_S)
        pid = pm.spawn("beside", Mortal).pid.call_one().get(timeout=T)  # the proc still serves others
    finally:
        pm.stop().get(timeout=T)
    assert wait_gone([pid]) == []
    _no_more(faults)


# --- what kills an actor ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
def test_base_exception_in_an_endpoint_kills_the_actor(procs, faults, kind):
    mortal = procs.spawn(f"mortal_{kind}", Mortal)
    one = mortal.slice(gpus=0)
    with pytest.raises(SupervisionError) as ei:
        one.base.call_one(kind).get(timeout=T)
    text = str(ei.value)
    assert isinstance(ei.value, RuntimeError)  # as Monarch's
    assert text.startswith(f"Endpoint call mortal_{kind}.base() failed, The actor <root>.<tests.monarch.actors.Mortal "
                           f"mortal_{kind}{{'gpus': 0/2}}> and all its descendants have failed:")
    assert f"Actor call mortal_{kind}.base failed with BaseException." in text
    assert ("SystemExit" if kind == "exit" else "KeyboardInterrupt") in text
    with pytest.raises(SupervisionError, match="and all its descendants have failed"):
        one.ok.call_one().get(timeout=T)
    failure = faults.get(timeout=T)  # the root hears of it exactly once
    assert (failure.mesh_name, failure.rank) == (f"mortal_{kind}", 0)
    _no_more(faults)
    assert mortal.slice(gpus=1).ok.call_one().get(timeout=T) == "ok"  # its sibling lives, and the proc
    mortal.stop().get(timeout=T)


def test_exception_in_an_explicit_port_endpoint_kills_the_actor(procs, faults):
    mortal = procs.spawn("explicit", Mortal)
    with pytest.raises(SupervisionError) as ei:
        mortal.slice(gpus=1).explicit_raise.call_one("no answer for you").get(timeout=T)
    assert "Actor call explicit.explicit_raise failed." in str(ei.value) and "no answer for you" in str(ei.value)
    with pytest.raises(SupervisionError):
        mortal.slice(gpus=1).ok.call_one().get(timeout=T)
    assert faults.get(timeout=T).rank == 1
    _no_more(faults)
    mortal.stop().get(timeout=T)


def test_an_exception_sent_to_the_port_of_a_broadcast_fails_the_actor(procs, faults):
    mortal = procs.spawn("dropping", Mortal)
    with pytest.raises(ValueError, match="answered so"):  # with a caller, it is the caller's
        mortal.slice(gpus=0).answer_with_exception.call_one("answered so").get(timeout=T)
    mortal.slice(gpus=1).answer_with_exception.broadcast("nobody reads this")
    failure = faults.get(timeout=T)
    assert failure.rank == 1 and "nobody reads this" in failure.report()
    _no_more(faults)
    assert mortal.slice(gpus=0).ok.call_one().get(timeout=T) == "ok"
    mortal.stop().get(timeout=T)


def test_abort_fails_the_actor(procs, faults):
    mortal = procs.spawn("aborter", Mortal)
    with pytest.raises(SupervisionError, match="aborted: enough"):
        mortal.slice(gpus=0).abort.call_one("enough").get(timeout=T)
    assert "aborted: enough" in faults.get(timeout=T).report()
    with pytest.raises(SupervisionError):
        mortal.slice(gpus=0).ok.call_one().get(timeout=T)
    mortal.stop().get(timeout=T)


# --- supervision routing and order ------------------------------------------------


def test_failure_of_a_mesh_spawned_on_someone_elses_procs_reaches_the_spawner(procs, faults):
    port, recv = Channel.open()
    foreman = procs.slice(gpus=0).spawn("foreman", Foreman, port)
    pm = this_host().spawn_procs(per_host={"gpus": 2})  # the client's procs
    try:
        pids = foreman.spawn_on.call_one(pm).get(timeout=T)
        os.kill(pids[1], signal.SIGKILL)
        mesh_name, rank, report = recv.recv().get(timeout=T)
        # Only the procs' owner hears the exit status from the host agent; the spawner sees the connection go.
        assert (mesh_name, rank) == ("hired", 1) and "connection lost" in report
        assert faults.get(timeout=T).rank == 1  # the procs' owner (the client) is told as well
        pm.stop().get(timeout=T)
        # The owner stopping its procs is no failure for the actors it ran for others.
        with pytest.raises(TimeoutError):
            recv.recv().get(timeout=QUIET_S)
        with pytest.raises(ActorError, match="actor mesh is stopped due to proc mesh shutdown"):
            foreman.spawn_on.call_one(pm).get(timeout=T)  # the foreman knows those procs are gone
    finally:
        pm.stop().get(timeout=T)
        foreman.stop().get(timeout=T)
    _no_more(faults)


def test_a_dead_proc_is_reported_once_with_actors_on_a_slice_of_it(faults):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        pid = pm.slice(gpus=1).spawn("sliced", Mortal).pid.call_one().get(timeout=T)
        os.kill(pid, signal.SIGKILL)
        failure = faults.get(timeout=T)  # as in Monarch, the actor mesh's failure, at its own rank
        assert (failure.mesh_name, failure.rank) == ("sliced", 0)
        _no_more(faults)
    finally:
        pm.stop().get(timeout=T)


def test_supervise_runs_before_queued_messages(procs, faults):
    port, recv = Channel.open()
    foreman = procs.slice(gpus=1).spawn("orderly", Foreman, port)
    kids = foreman.spawn_own.call_one(1).get(timeout=T)
    busy = foreman.busy_until_a_failure_waits.call_one()
    queued = foreman.note.call_one("queued")  # waits behind busy
    os.kill(kids[0], signal.SIGKILL)
    busy.get(timeout=T)
    assert recv.recv().get(timeout=T)[0] == "kids"  # the actor mesh that ran on the dead proc
    assert queued.get(timeout=T) == ["busy", "supervise", "queued"]
    _no_more(faults)
    foreman.stop().get(timeout=T)


def test_supervision_events_are_dropped_once_stop_begins(procs, faults):
    port, recv = Channel.open()
    foreman = procs.slice(gpus=1).spawn("stopping", Foreman, port)
    kids = foreman.spawn_own.call_one(1).get(timeout=T)
    busy = foreman.busy_until_stopping_then_lose_a_kid.call_one()
    stopped = foreman.stop()  # begins now; runs once busy returns, after the kid's proc died
    busy.get(timeout=T)
    stopped.get(timeout=T)
    assert wait_gone(kids) == []
    with pytest.raises(TimeoutError):
        recv.recv().get(timeout=QUIET_S)
    _no_more(faults)


def test_mesh_failure_report_is_a_method(procs):
    failure = MeshFailure("trainers", 3, "host7", "killed by SIGKILL", -9)
    assert failure.report() == "mesh 'trainers' rank 3 on host7: killed by SIGKILL"
    assert "trainers" in str(failure) and failure.mesh_name == "trainers"


# --- identity ---------------------------------------------------------------------


def test_current_actor_name_is_unique_per_actor(procs):
    a = procs.spawn("named", Mortal)
    b = procs.spawn("named", Mortal)
    names = a.name.call().get(timeout=T).values() + b.name.call().get(timeout=T).values()
    assert len(set(names)) == 4
    assert current_actor_name() == "root"
    a.stop().get(timeout=T)
    b.stop().get(timeout=T)


def test_this_proc_spawn_in_the_client_runs_in_the_client():
    local = this_proc().spawn("here", Mortal)
    assert local.pid.call_one().get(timeout=T) == os.getpid()
    assert local.ok.call_one().get(timeout=T) == "ok"
    local.stop().get(timeout=T)
    with pytest.raises(SupervisionError):
        local.ok.call_one().get(timeout=T)


def test_log_records_inside_an_actor_carry_its_name(procs):
    mortal = procs.spawn("chatty", Mortal)
    lines = mortal.slice(gpus=1).log_lines.call_one("hello there").get(timeout=T)
    assert lines == ["[actor=<root>.<tests.monarch.actors.Mortal chatty{'gpus': 1/2}>] hello there"]
    mortal.stop().get(timeout=T)


# --- lifecycle --------------------------------------------------------------------


def test_stopping_a_mesh_stops_the_meshes_its_actors_made(procs, tmp_path):
    outer = procs.spawn("outer", Worker, "outer")
    pids = outer.slice(gpus=0).spawn_nested.call_one(2).get(timeout=T)
    assert len(pids) == 2 and wait_gone(pids, 0) == pids
    outer.stop().get(timeout=T)
    assert wait_gone(pids) == []


def test_stopping_procs_runs_atexit_and_module_finalizers(tmp_path):
    path = tmp_path / "finalized.txt"
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    pid = pm.spawn("fin", Finalizable).arm.call_one(str(path)).get(timeout=T)
    pm.stop().get(timeout=T)
    assert wait_gone([pid]) == []
    assert sorted(path.read_text().split()) == ["__del__", "atexit"]


def test_concurrent_calls_are_cancelled_before_cleanup(procs):
    port, recv = Channel.open()
    c = procs.slice(gpus=0).spawn("canceller", Canceller, port)
    pending = [c.forever.call_one() for _ in range(3)]
    deadline = time.monotonic() + T
    while c.started_count.call_one().get(timeout=T) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    c.stop().get(timeout=T)
    assert recv.recv().get(timeout=T) == ("cleanup", 3)
    for f in pending:
        with pytest.raises(SupervisionError, match="stopped"):
            f.get(timeout=T)


def test_procs_see_the_clients_environment_at_spawn_time(monkeypatch):
    monkeypatch.setenv("ACTORS_TEST_SETTING", "set after the host agent started")
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mortal = pm.spawn("env", Mortal)
        assert mortal.env.call_one("ACTORS_TEST_SETTING").get(timeout=T) == "set after the host agent started"
    finally:
        pm.stop().get(timeout=T)
    monkeypatch.delenv("ACTORS_TEST_SETTING")
    assert "HOME" in os.environ  # the host agent started with it
    monkeypatch.delenv("HOME")  # removed since: the procs do not get it either
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mortal = pm.spawn("env", Mortal)
        assert mortal.env.call_one("ACTORS_TEST_SETTING").get(timeout=T) is None
        assert mortal.env.call_one("HOME").get(timeout=T) is None
    finally:
        pm.stop().get(timeout=T)


# --- helpers ----------------------------------------------------------------------


def test_accumulator_folds_every_answer(procs):
    w = procs.spawn("acc", Worker)
    acc = Accumulator(w.add, 0, lambda total, x: total + x)
    assert acc.accumulate(5, 1).get(timeout=T) == 12
    w.stop().get(timeout=T)


def test_get_or_spawn_controller_is_one_actor_for_the_whole_job(procs):
    counter = get_or_spawn_controller("counter", Counter, 100).get(timeout=T)
    assert counter.pid.call_one().get(timeout=T) == os.getpid()  # it lives in the root client
    assert counter.incr.call_one().get(timeout=T) == 101
    users = procs.spawn("users", ControllerUser)
    got = users.use_controller.call().get(timeout=T).values()
    assert sorted(n for n, _ in got) == [102, 103] and {p for _, p in got} == {os.getpid()}
    again = get_or_spawn_controller("counter", Counter, 0).get(timeout=T)
    assert again.incr.call_one().get(timeout=T) == 104
    users.stop().get(timeout=T)


def test_plain_methods_are_placeholders_and_as_endpoint_calls_them(procs):
    mortal = procs.spawn("plain", Mortal)
    with pytest.raises(RuntimeError, match="is not annotated as an endpoint. To call it as one"):
        mortal.plain(1)
    assert as_endpoint(mortal.plain).call(4).get(timeout=T).values() == [40, 40]
    with_port = as_endpoint(mortal.plain_with_port, explicit_response_port=True)
    assert with_port.call(2).get(timeout=T).values() == [200, 200]
    with pytest.raises(ValueError, match="expected an method of a spawned actor"):
        as_endpoint(mortal.ok)
    mortal.stop().get(timeout=T)


def test_flatten_and_value_mesh_slice():
    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    try:
        w = pm.spawn("flat", Worker)
        flat = w.flatten("rank")
        assert flat.sizes == {"rank": 4}
        assert flat.slice(rank=3).where.call_one().get(timeout=T) == (0, {})
        vm = w.point.call().get(timeout=T)
        assert vm.slice(hosts=1).values() == [{"hosts": 1, "gpus": 0}, {"hosts": 1, "gpus": 1}]
        assert vm.slice(hosts=1, gpus=0).item() == {"hosts": 1, "gpus": 0}
        flat_vm = vm.flatten("rank")
        assert isinstance(flat_vm, ValueMesh) and [p.rank for p, _ in flat_vm.items()] == [0, 1, 2, 3]
        assert flat_vm.item(rank=2) == {"hosts": 1, "gpus": 0}
    finally:
        pm.stop().get(timeout=T)


def test_channel_open_ranked(procs):
    mortal = procs.spawn("ranked", Mortal)
    port, recv = Channel.open_ranked()
    mortal.ranked.call("x")  # the answers go to the call's own port; use send() to ours
    from monarch.actor import send

    send(mortal.ranked, ("y",), {}, port=port)
    got = sorted(recv.recv().get(timeout=T) for _ in range(2))
    assert got == [(0, "y"), (1, "y")]
    mortal.stop().get(timeout=T)


def test_actor_logger_is_named_after_the_class(procs):
    mortal = procs.spawn("logger", Mortal)
    assert mortal.slice(gpus=0).log_lines.call_one("x").get(timeout=T)[0].endswith("] x")
    import logging

    assert Mortal.logger.__get__(Mortal.__new__(Mortal)).name == "Mortal"
    assert Mortal.logger.__get__(Mortal.__new__(Mortal)).level == logging.DEBUG
    mortal.stop().get(timeout=T)


# --- error texts ------------------------------------------------------------------


def test_calls_to_a_stopped_mesh_say_it_was_stopped(procs):
    w = procs.spawn("printer", Worker)
    assert w.add.call(1, 1).get(timeout=T).values() == [2, 2]
    w.stop().get(timeout=T)
    with pytest.raises(SupervisionError) as ei:
        w.add.call(1, 1).get(timeout=T)
    assert str(ei.value).startswith("Endpoint call printer.add() failed, Supervision event: actor printer[")
    assert "has status: stopped" in str(ei.value)


def test_actor_error_text_starts_with_monarchs(procs):
    w = procs.spawn("texts", Worker)
    with pytest.raises(ActorError) as ei:
        w.slice(gpus=1).fail.call_one("broken").get(timeout=T)
    text = str(ei.value)
    assert text.startswith("Actor call texts.fail failed. (rank 1 on ")
    assert "Traceback of where the remote call failed (most recent call last):" in text
    assert ei.value.message == "Actor call texts.fail failed."
    assert isinstance(ei.value.exception, ValueError)
    w.stop().get(timeout=T)


def test_concurrent_endpoint_error_texts():
    with pytest.raises(ValueError, match="concurrent_endpoint can only wrap async endpoints"):
        concurrent_endpoint(lambda self: None)
    with pytest.raises(ValueError, match="concurrent_endpoint does not wrap @endpoint"):
        concurrent_endpoint(endpoint(lambda self: None))
