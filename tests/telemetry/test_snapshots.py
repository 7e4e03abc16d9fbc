"""Monarch's mesh-introspection snapshots: a job with telemetry captures its mesh admin tree every
``snapshot_interval_secs`` into Monarch's snapshot tables, joined by node ids."""

import time

import monarch.actor
from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob, TelemetryConfig


class Snapped(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def fail(self) -> None:
        raise ValueError("snapped on purpose")


def test_captures_hold_the_tree_of_hosts_procs_and_actors_with_failures(no_leaked_processes):
    job = ProcessJob({"hosts": 1}).enable_telemetry(TelemetryConfig(snapshot_interval_secs=0.5))
    state = job.state(cached_path=None)
    q = state.query_engine_client.query
    hook = monarch.actor.unhandled_fault_hook
    try:
        monarch.actor.unhandled_fault_hook = lambda failure: None
        actors = state.hosts.spawn_procs(per_host={"gpus": 2}, name="snapme").spawn("snapped", Snapped)
        actors.ping.call().get()
        actors.slice(gpus=1).fail.broadcast()
        # The newest capture that has seen the failure (captures keep coming every half second).
        latest = ("SELECT s.snapshot_id FROM snapshots s JOIN actor_failures f ON f.snapshot_id = s.snapshot_id "
                  "ORDER BY s.snapshot_ts DESC LIMIT 1")
        rows: list = []
        while not rows:
            rows = q(latest)["rows"]
            time.sleep(0.2)
        sid = rows[0]["snapshot_id"]
        got = q("SELECT a.node_id, a.actor_status, a.actor_type, a.messages_processed, a.is_system, pn.proc_name, "
                "pn.failed_actor_count, pn.is_poisoned, h.node_id AS host_id, ch2.parent_id AS root_id "
                "FROM actor_nodes a "
                "JOIN children ch ON ch.snapshot_id = a.snapshot_id AND ch.child_id = a.node_id "
                "JOIN proc_nodes pn ON pn.snapshot_id = a.snapshot_id AND pn.node_id = ch.parent_id "
                "JOIN children ch1 ON ch1.snapshot_id = a.snapshot_id AND ch1.child_id = pn.node_id "
                "JOIN host_nodes h ON h.snapshot_id = a.snapshot_id AND h.node_id = ch1.parent_id "
                "JOIN children ch2 ON ch2.snapshot_id = a.snapshot_id AND ch2.child_id = h.node_id "
                f"WHERE a.snapshot_id = '{sid}' AND pn.proc_name LIKE 'snapme%' ORDER BY a.node_id")["rows"]
        assert len(got) == 2, got
        assert {r["root_id"] for r in got} == {"root"}
        assert all(r["actor_type"] == "Snapped" and r["is_system"] is False for r in got)
        statuses = sorted(r["actor_status"].split(":")[0] for r in got)
        assert statuses == ["failed", "idle"], got
        failed = next(r for r in got if r["actor_status"].startswith("failed"))
        assert "snapped on purpose" in failed["actor_status"]
        assert failed["failed_actor_count"] == 1 and failed["is_poisoned"] is True
        kinds = q(f"SELECT node_kind, count(*) AS n FROM nodes WHERE snapshot_id = '{sid}' GROUP BY node_kind "
                  "ORDER BY node_kind")["rows"]
        assert {r["node_kind"]: r["n"] for r in kinds} == {"actor": 2, "host": 1, "proc": 2, "root": 1}
        [failure] = q(f"SELECT failure_root_cause_name, failure_error_message FROM actor_failures "
                      f"WHERE snapshot_id = '{sid}'")["rows"]
        assert failure["failure_root_cause_name"] == "snapped[1]"
        assert "snapped on purpose" in failure["failure_error_message"]
    finally:
        monarch.actor.unhandled_fault_hook = hook
        job.kill()
