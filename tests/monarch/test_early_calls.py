"""A call that reaches a proc before its actor's spawn (they came from different processes: an
actor spawned a mesh and returned it, and its caller called the mesh at once) waits for the spawn
and runs after ``__init__``; one for an actor that never comes is refused after a while."""

from __future__ import annotations

import uuid

import pytest

from monarch.actor import ActorMesh, SupervisionError, this_host
from monarch_agents import messages as m
from monarch_agents import proc_agent
from tests.monarch.actors import Notebook


def _call(actor_id: str, method: str, sender: str, *args) -> m.Call:
    return m.Call(actor_id, method, m.Pickled.of((args, {})), {}, {}, None, 0, sender)


def test_a_call_that_comes_before_its_actors_spawn_runs_after_init():
    pm = this_host().spawn_procs()
    try:
        rt = pm._rt()
        addr = pm._procs[0].addr
        actor_id = f"late-{uuid.uuid4().hex[:12]}"
        # The same sender here, so the order is sure: the call first, then the spawn.
        rt.send(addr, _call(actor_id, "remember", rt.addr, "early"))
        rt.send(addr, m.SpawnActor(actor_id, "late", m.Pickled.of((Notebook, (), {})), {}, {},
                                   m.PortRef(rt.addr, 0), rt.addr))
        mesh = ActorMesh(actor_id, "late", Notebook, pm._procs, pm._shape, pm)
        assert mesh.recall.call_one().get(timeout=60) == ["early"]
    finally:
        pm.stop().get()


def test_a_call_for_an_actor_that_never_comes_is_refused():
    pm = this_host().spawn_procs()
    try:
        mesh = ActorMesh(f"never-{uuid.uuid4().hex[:12]}", "never", Notebook, pm._procs, pm._shape, pm)
        with pytest.raises(SupervisionError, match="never started"):
            mesh.recall.call_one().get(timeout=60)
    finally:
        pm.stop().get()
    assert proc_agent._EARLY_WAIT_S > 0
