"""A stopped actor's ``Stopped`` status carries the reason ``ActorMesh.stop(reason)`` gave (Monarch's
default: 'stopped by client'), as Monarch's actor_status_events record it."""

import time

from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob, TelemetryConfig


class Idle(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def _stopped_reasons(state, name: str, n: int) -> list:
    rows: list = []
    for _ in range(300):
        rows = state.query_engine_client.query(
            # actors rows come from the proc agents (meshes rows from the client would do too: each job
            # of this shared pytest process gets the client's rows of its own).
            "SELECT e.reason FROM actor_status_events e JOIN actors a ON e.actor_id = a.id "
            f"WHERE a.display_name LIKE '{name}[%' AND e.new_status = 'Stopped'")["rows"]
        if len(rows) >= n:
            break
        time.sleep(0.1)
    return sorted(r["reason"] for r in rows)


def test_stopped_status_carries_the_stop_reason(no_leaked_processes):
    job = ProcessJob({"hosts": 1}).enable_telemetry(TelemetryConfig())
    state = job.state(cached_path=None)
    try:
        procs = state.hosts.spawn_procs(per_host={"gpus": 2})
        default = procs.spawn("stop_default", Idle)
        given = procs.spawn("stop_given", Idle)
        default.ping.call().get()
        given.ping.call().get()
        default.stop().get()
        given.stop("done with it").get()
        assert _stopped_reasons(state, "stop_default", 2) == ["stopped by client"] * 2
        assert _stopped_reasons(state, "stop_given", 2) == ["done with it"] * 2
    finally:
        job.kill()


def test_a_call_to_a_stopped_mesh_is_handled_by_the_clients_root(no_leaked_processes):
    """The failure of a call that reached no live actor (Monarch: an undeliverable message, handled by
    the client's root actor) gives the client's ``<root>`` a Processing status; a reply does not."""
    import monarch.actor
    import pytest
    from monarch.actor import SupervisionError

    job = ProcessJob({"hosts": 1}).enable_telemetry(TelemetryConfig())
    state = job.state(cached_path=None)
    q = state.query_engine_client.query
    root = ("SELECT count(*) AS n FROM actor_status_events e JOIN actors a ON e.actor_id = a.id "
            "WHERE a.display_name = '<root>' AND e.new_status = 'Processing'")
    hook = monarch.actor.unhandled_fault_hook
    try:
        idle = state.hosts.spawn_procs(per_host={"gpus": 1}).spawn("bounced", Idle)
        idle.ping.call().get()
        idle.stop().get()
        assert q(root)["rows"] == [{"n": 0}]
        monarch.actor.unhandled_fault_hook = lambda failure: None
        with pytest.raises(SupervisionError, match="stopped"):
            idle.ping.call().get()
        for _ in range(300):
            if q(root)["rows"] != [{"n": 0}]:
                break
            time.sleep(0.1)
        assert q(root)["rows"] == [{"n": 1}]
    finally:
        monarch.actor.unhandled_fault_hook = hook
        job.kill()
