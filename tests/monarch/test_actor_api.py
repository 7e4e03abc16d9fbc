"""The monarch.actor API against real procs (forked by this process's private host agent)."""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest

from monarch.actor import (
    ActorError,
    ActorMesh,
    Channel,
    Extent,
    Future,
    Point,
    ProcMesh,
    SupervisionError,
    ValueMesh,
    context,
    current_rank,
    current_size,
    send,
    this_host,
)
from monarch.actor._shape import Shape
from tests.helpers import ROOT, run_script, wait_gone
from tests.monarch import actors
from tests.monarch.actors import AsyncWorker, BadInit, Mixed, Worker

pytestmark = pytest.mark.timeout(60)

T = 30  # seconds any single answer may take before the test is considered hung


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    yield pm
    pm.stop().get(timeout=T)


@pytest.fixture(scope="module")
def workers(procs):
    return procs.spawn("workers", Worker, "w")


@pytest.fixture(scope="module")
def async_workers(procs):
    return procs.spawn("async_workers", AsyncWorker)


# -- calling -----------------------------------------------------------------------


def test_call_returns_value_mesh_over_gpus(workers):
    vm = workers.add.call(2, b=3).get(timeout=T)
    assert isinstance(vm, ValueMesh)
    assert vm.extent.as_dict() == {"gpus": 4}
    assert vm.values() == [5, 5, 5, 5]
    assert len(vm) == 4
    pids = workers.pid.call().get(timeout=T).values()
    assert len(set(pids)) == 4 and os.getpid() not in pids


def test_value_mesh_item_items_values(workers):
    vm = workers.where.call().get(timeout=T)
    assert [vm.item(gpus=g) for g in range(4)] == [(g, {"gpus": 4}) for g in range(4)]
    items = list(vm.items())
    assert [p.rank for p, _ in items] == [0, 1, 2, 3]
    assert all(isinstance(p, Point) and p["gpus"] == v[0] for p, v in items)
    assert vm.values() == [v for _, v in items]
    with pytest.raises(KeyError):
        vm.item()
    with pytest.raises(KeyError):
        vm.item(gpus=0, hosts=0)
    with pytest.raises(IndexError):
        vm.item(gpus=4)


def test_slice_call_one(workers):
    assert workers.slice(gpus=1).add.call_one(40, 2).get(timeout=T) == 42
    assert workers.slice(gpus=1).where.call_one().get(timeout=T) == (0, {})
    pids = workers.pid.call().get(timeout=T)
    assert workers.slice(gpus=3).pid.call_one().get(timeout=T) == pids.item(gpus=3)


def test_call_one_on_many_actors_raises_at_once(workers):
    with pytest.raises(ValueError, match="exactly 1 actor"):
        workers.add.call_one(1)
    with pytest.raises(ValueError):
        workers.slice(gpus=slice(0, 2)).add.call_one(1)


def test_bad_arguments_raise_in_the_caller(workers):
    with pytest.raises(TypeError):
        workers.add.call()  # missing ``a``
    with pytest.raises(TypeError):
        workers.add.call(1, 2, 3)
    with pytest.raises(AttributeError):
        workers.no_such_endpoint  # noqa: B018  (the attribute access is what raises)
    # The mesh still works after refused calls.
    assert workers.add.call(1).get(timeout=T).values() == [1] * 4


def test_choose(workers):
    pids = set(workers.pid.call().get(timeout=T).values())
    seen = {workers.pid.choose().get(timeout=T) for _ in range(20)}
    assert seen and seen <= pids


def test_stream_yields_futures_in_arrival_order(workers):
    futures = list(workers.hold.stream())
    assert len(futures) == 4 and all(isinstance(f, Future) for f in futures)
    # Each actor answers only when released, so the arrival order is ours to choose.
    order = [2, 0, 3, 1]
    for k, rank in enumerate(order):
        assert not futures[k].done()
        assert workers.slice(gpus=rank).release.call_one().get(timeout=T)
        assert futures[k].get(timeout=T) == rank
    assert [f.get() for f in futures] == order


def test_broadcast(procs):
    w = procs.spawn("bcast", Worker)
    assert w.record.broadcast("x") is None
    w.record.broadcast("y")
    # Messages from one sender to one actor are handled in order: the broadcasts came first.
    assert w.records.call().get(timeout=T).values() == [["x", "y"]] * 4
    w.stop().get(timeout=T)


def test_send_with_port_and_selection(workers):
    port, recv = Channel.open()
    send(workers.add, (1,), {"b": 2}, port=port)
    assert sorted(recv.recv().get(timeout=T) for _ in range(4)) == [3, 3, 3, 3]
    send(workers.add, (5,), {}, port=port, selection="choose")
    assert recv.recv().get(timeout=T) == 5


# -- where am I ----------------------------------------------------------------------


def test_current_rank_and_size_are_relative_to_the_messaged_slice(workers):
    assert workers.where.call().get(timeout=T).values() == [(r, {"gpus": 4}) for r in range(4)]
    sub = workers.slice(gpus=slice(1, 3))
    assert sub.where.call().get(timeout=T).values() == [(0, {"gpus": 2}), (1, {"gpus": 2})]
    assert workers.slice(gpus=slice(None, None, 2)).point.call().get(timeout=T).values() == [{"gpus": 0}, {"gpus": 1}]


def test_two_dimensional_mesh_slicing():
    pm = this_host().spawn_procs(per_host={"replicas": 2, "gpus": 2})
    try:
        assert pm.sizes == {"replicas": 2, "gpus": 2}
        w = pm.spawn("grid", Worker)
        vm = w.point.call().get(timeout=T)
        assert vm.extent.as_dict() == {"replicas": 2, "gpus": 2}
        assert vm.item(replicas=1, gpus=0) == {"replicas": 1, "gpus": 0}
        row = w.slice(replicas=1)
        assert row.where.call().get(timeout=T).values() == [(0, {"gpus": 2}), (1, {"gpus": 2})]
        col = w.slice(gpus=1)
        assert col.point.call().get(timeout=T).values() == [{"replicas": 0}, {"replicas": 1}]
        pids = w.pid.call().get(timeout=T)
        assert w.slice(replicas=1, gpus=1).pid.call_one().get(timeout=T) == pids.item(replicas=1, gpus=1)
    finally:
        pm.stop().get(timeout=T)


def test_two_hosts(client, tmp_path):
    from monarch.actor import HostMesh
    from monarch.actor._client import HostRef
    from tests.helpers import start_host_agent

    agents = [start_host_agent(client.keys, tmp_path, hostname=f"node{r}", extra=["--host-rank", str(r)])
              for r in range(2)]
    try:
        hosts = HostMesh([HostRef(a.addr, a.info["host"], r) for r, a in enumerate(agents)])
        assert hosts.sizes == {"hosts": 2}
        pm = hosts.spawn_procs(per_host={"gpus": 2})
        assert pm.sizes == {"hosts": 2, "gpus": 2}
        w = pm.spawn("spread", Worker)
        where = w.whoami.call().get(timeout=T)
        pids = [v["pid"] for v in where.values()]
        for r, a in enumerate(agents):
            assert {where.item(hosts=r, gpus=g)["pid"] for g in range(2)} <= set(a.children())
        assert w.slice(hosts=1).where.call().get(timeout=T).values() == [(0, {"gpus": 2}), (1, {"gpus": 2})]
        assert w.slice(gpus=0).point.call().get(timeout=T).values() == [{"hosts": 0}, {"hosts": 1}]
        pm.stop().get(timeout=T)
        assert wait_gone(pids) == []
    finally:
        for a in agents:
            a.stop()


def test_a_host_agents_preload_is_imported_by_its_zygote_for_every_proc(client, tmp_path, workers):
    """monarch_agents/ names no module of the layer above: what the zygote imports comes from --preload."""
    from tests.helpers import start_host_agent

    # colorsys: a module nothing here imports, so only the preload can have put it in a proc.
    agent = start_host_agent(client.keys, tmp_path, hostname="preloaded",
                             extra=["--preload", "monarch.actor,colorsys"])
    try:
        pm = agent.host_mesh().spawn_procs(per_host={"gpus": 2})
        assert pm.spawn("preloaded", Worker).loaded.call("colorsys").get(timeout=T).values() == [True, True]
        pm.stop().get(timeout=T)
    finally:
        agent.stop()
    assert not any(workers.loaded.call("colorsys").get(timeout=T).values())  # this_host()'s agent: not asked


def test_spawn_on_a_slice_of_a_proc_mesh(procs, workers):
    all_pids = workers.pid.call().get(timeout=T).values()
    half = procs.slice(gpus=slice(2, 4)).spawn("half", Worker)
    assert len(half) == 2
    assert half.pid.call().get(timeout=T).values() == all_pids[2:]
    assert half.whoami.call().get(timeout=T).values()[1]["actor_rank"] == 1  # ranks count within the slice
    assert half.slice(gpus=1).pid.call_one().get(timeout=T) == all_pids[3]
    half.stop().get(timeout=T)


def test_context_inside_and_outside_actors(workers):
    info = workers.slice(gpus=2).whoami.call_one().get(timeout=T)
    assert info["name"] == "workers"
    assert info["class_name"] == "Worker"
    assert info["actor_rank"] == 2  # its place in the mesh it was spawned on
    assert info["message_rank"] == 0  # its place in the one-actor slice that was messaged
    ctx = context()
    assert ctx.actor_instance.name == "root"  # Monarch's name for the client
    assert ctx.message_rank.rank == 0
    assert current_rank().rank == 0 and current_size() == {}


# -- futures ---------------------------------------------------------------------------


def test_future_get_timeout_does_not_consume(workers):
    one = workers.slice(gpus=0)
    fut = one.hold.call_one("late")
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    with pytest.raises(TimeoutError):
        fut.result(timeout=0)
    assert not fut.done()
    one.release.call_one().get(timeout=T)
    assert fut.get() == "late"
    assert fut.get(timeout=0) == "late"  # a done future can be read again
    assert fut.exception() is None


def test_await_futures_in_asyncio(workers, async_workers):
    async def main():
        vm = await workers.add.call(1, 1)
        one = await workers.slice(gpus=3).add.call_one(2, 2)
        many = await asyncio.gather(*(async_workers.slice(gpus=g).add.call_one(g, 10) for g in range(4)))
        done = Future.completed(7)
        return vm.values(), one, many, await done

    assert asyncio.run(main()) == ([2, 2, 2, 2], 4, [10, 11, 12, 13], 7)


def test_await_failure_raises(workers):
    async def main():
        await workers.slice(gpus=0).fail.call_one("async path")

    with pytest.raises(ActorError, match="async path"):
        asyncio.run(main())


def test_thousand_messages_to_one_actor_keep_their_order(procs):
    w = procs.spawn("ordered", Worker)
    one = w.slice(gpus=1)
    futures = [one.record.call_one(i) for i in range(1000)]
    assert [f.get(timeout=T) for f in futures] == list(range(1, 1001))
    assert one.records.call_one().get(timeout=T) == list(range(1000))
    w.stop().get(timeout=T)


def test_thousand_concurrent_futures(workers):
    futures = [workers.slice(gpus=i % 4).add.call_one(i, 1) for i in range(1000)]
    assert all(not isinstance(f, int) for f in futures)
    assert [f.get(timeout=T) for f in futures] == [i + 1 for i in range(1000)]
    meshes = [workers.add.call(i) for i in range(250)]
    assert [m.get(timeout=T).values() for m in meshes] == [[i] * 4 for i in range(250)]


# -- ports and channels ---------------------------------------------------------------


def test_channel_port_send_and_recv(workers):
    port, recv = Channel.open()
    assert workers.slice(gpus=1).send_to.call_one(port, ["a", "b", {"c": 3}]).get(timeout=T) == 3
    assert [recv.recv().get(timeout=T) for _ in range(3)] == ["a", "b", {"c": 3}]
    # recv() before the value arrives, then send from this process.
    pending = recv.recv()
    assert not pending.done()
    port.send(42)
    assert pending.get(timeout=T) == 42
    port.exception(KeyError("nope"))
    with pytest.raises(KeyError):
        recv.recv().get(timeout=T)


def test_channel_opened_inside_an_actor(workers):
    assert workers.slice(gpus=0).channel_roundtrip.call_one([1, "two", 3.0]).get(timeout=T) == [1, "two", 3.0]


def test_explicit_response_port_endpoints(workers):
    assert workers.slice(gpus=2).twice.call_one(21).get(timeout=T) == 42
    assert workers.twice.call(5).get(timeout=T).values() == [10] * 4
    with pytest.raises(KeyError, match="refused"):
        workers.slice(gpus=0).refuse.call_one("refused").get(timeout=T)


# -- sync and async actors ----------------------------------------------------------------


def test_sync_and_async_actors(workers, async_workers):
    assert workers.add.call(3, 4).get(timeout=T).values() == [7] * 4
    assert async_workers.add.call(3, 4).get(timeout=T).values() == [7] * 4
    assert async_workers.slice(gpus=slice(2, 4)).where.call().get(timeout=T).values() == [(0, {"gpus": 2}), (1, {"gpus": 2})]
    futures = [async_workers.slice(gpus=0).record.call_one(i) for i in range(200)]
    assert [f.get(timeout=T) for f in futures] == list(range(1, 201))
    with pytest.raises(ActorError, match="async kaboom"):
        async_workers.slice(gpus=1).fail.call_one().get(timeout=T)


def test_concurrent_endpoints_overlap(async_workers):
    one = async_workers.slice(gpus=3)
    waiting = one.wait_gate.call_one()
    with pytest.raises(TimeoutError):
        waiting.get(timeout=0.05)
    assert one.open_gate.call_one().get(timeout=T) is True  # handled while wait_gate is still running
    assert waiting.get(timeout=T) == "opened"


def test_mixed_sync_async_class_is_refused_at_spawn(procs):
    with pytest.raises(ValueError, match="async and sync"):
        procs.spawn("mixed", Mixed)


def test_spawn_refuses_non_actors(procs):
    with pytest.raises(ValueError):
        procs.spawn("nope", dict)


# -- meshes as values; nesting ---------------------------------------------------------------


def test_actor_mesh_passed_to_another_actor(procs, workers, async_workers):
    helpers = procs.spawn("helpers", Worker)
    # A sync actor calls a mesh it was handed...
    assert workers.slice(gpus=0).call_other.call_one(helpers, 1, 2).get(timeout=T) == [3] * 4
    # ... every rank of it can, at once ...
    assert workers.call_other.call(helpers.slice(gpus=slice(0, 2)), 5).get(timeout=T).values() == [[5, 5]] * 4
    # ... and so can an async actor, awaiting the answer.
    assert async_workers.slice(gpus=1).call_other.call_one(helpers, 2, 2).get(timeout=T) == [4] * 4
    helpers.stop().get(timeout=T)


def test_actor_spawns_its_own_procs_and_actors(procs):
    parent = procs.spawn("parent", Worker).slice(gpus=0)
    nested_pids = parent.spawn_nested.call_one(2).get(timeout=T)
    assert len(set(nested_pids)) == 2
    proc_pids = set(parent.pid.call_one().get(timeout=T) for _ in range(1))
    assert not proc_pids & set(nested_pids)
    assert parent.nested_call.call_one(41).get(timeout=T) == [42, 42]
    parent.stop_nested.call_one().get(timeout=T)
    assert wait_gone(nested_pids) == []


# -- errors ------------------------------------------------------------------------------------


def test_endpoint_exception_is_actor_error_with_remote_traceback(workers):
    with pytest.raises(ActorError) as ei:
        workers.slice(gpus=2).fail.call_one("broken on purpose").get(timeout=T)
    e = ei.value
    text = str(e)
    assert isinstance(e.exception, ValueError)
    assert "broken on purpose" in text
    assert "actors.py" in text and f"line {actors.FAIL_LINE}" in text
    assert "rank 2" in text and e.rank == 2
    assert e.host and e.host in text
    assert "workers.fail" in text
    assert "Traceback" in e.remote_traceback
    # The actor survives its endpoint's exception.
    assert workers.slice(gpus=2).add.call_one(1, 1).get(timeout=T) == 2


def test_exception_from_call_on_whole_mesh(workers):
    with pytest.raises(ActorError, match="kaboom"):
        workers.fail.call().get(timeout=T)
    assert workers.add.call(0).get(timeout=T).values() == [0] * 4


def test_a_mesh_whose_init_failed_stops_cleanly(monkeypatch):
    import time

    import monarch.actor

    failures: list = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", failures.append)
    # Procs of its own: the failed __init__ poisons its proc (the module's procs stay healthy).
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        watcher = pm.spawn("watcher", Worker, "w")
        watcher.initialized.get(timeout=T)
        bad = pm.spawn("bad_one", BadInit, 1)  # returns at once (test_monarch_semantics has the rest)
        with pytest.raises(SupervisionError, match="cannot start rank 1"):
            bad.initialized.get(timeout=T)
        bad.stop().get(timeout=T)
        # Every rank, the failed one too, is gone: their threads end.
        deadline = time.monotonic() + 5
        while True:
            left = [n for names in watcher.threads.call().get(timeout=T).values() for n in names if "bad_one" in n]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert left == []
        assert [f.rank for f in failures] == [1]
        # As in Monarch, the proc where __init__ failed takes no new actor, even once the failed
        # one is stopped; the others do.
        with pytest.raises(RuntimeError, match="Cannot spawn new actors on mesh with supervision events"):
            pm.slice(gpus=1).spawn("again", BadInit, 99).initialized.get(timeout=T)
        ok = pm.slice(gpus=0).spawn("good", BadInit, 99)
        assert ok.ok.call().get(timeout=T).values() == [True]
    finally:
        pm.stop().get(timeout=T)


def test_unpicklable_result_is_an_error_not_a_hang(workers):
    with pytest.raises(Exception, match="pickle"):
        workers.slice(gpus=0).echo.call_one(Weird()).get(timeout=T)


class Weird:
    """Picklable here; its result on the way back is not (a lock inside)."""

    def __reduce__(self):
        return _make_lock_holder, ()


def _make_lock_holder():
    import threading

    class Holder:
        def __init__(self):
            self.lock = threading.Lock()

    return Holder()


# -- stopping -----------------------------------------------------------------------------------


def test_actor_mesh_stop_runs_cleanup_and_later_calls_fail(procs, tmp_path):
    port, recv = Channel.open()
    marker = tmp_path / "cleanup.txt"
    w = procs.spawn("stoppable", Worker, "s", port, str(marker))
    pids = w.pid.call().get(timeout=T).values()
    w.stop().get(timeout=T)
    got = sorted(recv.recv().get(timeout=T) for _ in range(4))
    assert got == sorted(("cleanup", "s", p) for p in pids)
    assert sorted(marker.read_text().split()) == sorted(f"s:{p}" for p in pids)
    with pytest.raises(SupervisionError):
        w.add.call(1).get(timeout=T)
    with pytest.raises(SupervisionError):
        w.slice(gpus=0).add.call_one(1).get(timeout=T)
    # Other actors on the same procs are untouched.
    other = procs.spawn("after_stop", Worker)
    assert other.add.call(1).get(timeout=T).values() == [1] * 4
    other.stop().get(timeout=T)


def test_async_actor_cleanup_runs_on_stop(procs):
    port, recv = Channel.open()
    w = procs.spawn("async_stoppable", AsyncWorker, port)
    w.slice(gpus=0).stop().get(timeout=T)
    assert recv.recv().get(timeout=T)[:2] == ("cleanup", "async")
    with pytest.raises(SupervisionError):
        w.slice(gpus=0).add.call_one(1).get(timeout=T)
    assert w.slice(gpus=1).add.call_one(1, 1).get(timeout=T) == 2
    w.stop().get(timeout=T)


def test_stopping_an_async_actor_fails_its_running_calls_and_ends_its_threads(procs, workers):
    import time

    one = procs.spawn("short_lived", AsyncWorker).slice(gpus=1)
    running = one.wait_gate.call_one()  # a concurrent call that never finishes by itself
    assert one.pid.call_one().get(timeout=T)
    names = workers.slice(gpus=1).threads.call_one().get(timeout=T)
    assert "actor-short_lived" in names
    one.stop().get(timeout=T)
    with pytest.raises(SupervisionError, match="stopped"):
        running.get(timeout=T)
    deadline = time.monotonic() + 5
    while True:  # the actor's threads end soon after it answered the stop
        names = workers.slice(gpus=1).threads.call_one().get(timeout=T)
        if not [n for n in names if n.startswith("actor-short_lived")] or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not [n for n in names if n.startswith("actor-short_lived")]


def test_proc_mesh_stop(tmp_path):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    port, recv = Channel.open()
    w = pm.spawn("w", Worker, "pm", port)
    pids = w.pid.call().get(timeout=T).values()
    pm.stop().get(timeout=T)
    assert sorted(recv.recv().get(timeout=T)[2] for _ in range(2)) == sorted(pids)  # cleanup ran
    assert wait_gone(pids) == []
    with pytest.raises(SupervisionError):
        w.add.call(1).get(timeout=T)
    with pytest.raises(SupervisionError):
        pm.spawn("again", Worker)
    pm.stop().get(timeout=T)  # stopping twice is fine


def test_async_with_proc_mesh():
    async def main():
        async with this_host().spawn_procs(per_host={"gpus": 2}) as pm:
            assert isinstance(pm, ProcMesh)
            w = pm.spawn("w", AsyncWorker)
            pids = (await w.pid.call()).values()
            assert (await w.add.call(2, 3)).values() == [5, 5]
        return pm, w, pids

    pm, w, pids = asyncio.run(main())
    assert wait_gone(pids) == []
    with pytest.raises(SupervisionError):
        w.add.call(1).get(timeout=T)


def test_with_proc_mesh():
    with this_host().spawn_procs(per_host={"gpus": 1}) as pm:
        pids = pm.spawn("w", Worker).pid.call().get(timeout=T).values()
    assert wait_gone(pids) == []


# -- shapes (no procs) -------------------------------------------------------------------------------


def test_shape_slicing_and_points():
    s = Shape(("hosts", "gpus"), (2, 4))
    assert len(s) == 8
    assert s.slice(hosts=1).indices == (4, 5, 6, 7)
    assert s.slice(gpus=slice(1, 3)).indices == (1, 2, 5, 6)
    assert s.slice(hosts=-1, gpus=-1).indices == (7,)
    assert s.slice(gpus=slice(None, None, 2)).slice(hosts=0).indices == (0, 2)
    with pytest.raises(TypeError):
        s.slice(nodes=0)
    with pytest.raises(IndexError):
        s.slice(gpus=4)
    with pytest.raises(IndexError):
        s.slice(gpus=slice(4, 9))
    p = Point(6, Extent(["hosts", "gpus"], [2, 4]))
    assert dict(p) == {"hosts": 1, "gpus": 2} and p.rank == 6 and p.size("gpus") == 4
    assert p == {"hosts": 1, "gpus": 2}
    vm = ValueMesh(s, list(range(8)))
    assert vm.item(hosts=1, gpus=3) == 7
    assert [v for _, v in vm.items()] == list(range(8))


def test_actor_mesh_repr_and_len(workers):
    assert len(workers) == 4
    assert workers.size("gpus") == 4
    assert "Worker" in repr(workers)
    assert isinstance(workers, ActorMesh)


def test_classes_from_modules_travel_by_reference(workers):
    from monarch_agents import wire

    body, _ = wire.dumps(Worker)
    assert b"tests.monarch.actors" in body and len(body) < 200  # a name, not the class's code
    info = workers.slice(gpus=0).whoami.call_one().get(timeout=T)
    assert info["module"] == "tests.monarch.actors"
    assert info["module_file"] == actors.__file__  # the proc imported the very same file


# -- scripts: classes in __main__ travel by value -----------------------------------------------------


SCRIPT = textwrap.dedent('''
    import dataclasses, json, os, sys
    from monarch.actor import Actor, endpoint, this_host, current_rank
    from sibling_helpers import Doubler  # a module next to the script, not on the default path

    @dataclasses.dataclass
    class Box:
        value: int

    def square(x):
        return x * x

    class Main(Actor):
        def __init__(self, fn):
            self.fn = fn

        @endpoint
        def apply(self, box):
            return Box(self.fn(box.value) + current_rank().rank)

        @endpoint
        def module(self):
            return type(self).__module__, os.getpid()

    if __name__ == "__main__":
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        m = procs.spawn("main", Main, square)
        boxes = m.apply.call(Box(3)).get(timeout=30).values()
        assert all(isinstance(b, Box) for b in boxes), boxes
        d = procs.spawn("doubler", Doubler).twice.call(21).get(timeout=30).values()
        mods = m.module.call().get(timeout=30).values()
        print(json.dumps({"values": [b.value for b in boxes], "doubled": d, "modules": [x[0] for x in mods],
                          "pids": [x[1] for x in mods], "me": os.getpid()}))
        procs.stop().get(timeout=30)
''')

SIBLING = textwrap.dedent('''
    from monarch.actor import Actor, endpoint

    class Doubler(Actor):
        @endpoint
        def twice(self, x):
            return 2 * x
''')


def test_script_with_actor_class_in_main(tmp_path):
    import json

    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    (tmp_path / "sibling_helpers.py").write_text(SIBLING)
    # Run from another directory, as a user would: python path/to/script.py
    r = run_script(script, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["values"] == [9, 10]
    assert out["doubled"] == [42, 42]
    assert out["modules"] == ["__main__", "__main__"]
    assert out["me"] not in out["pids"]
    assert wait_gone(out["pids"]) == []
