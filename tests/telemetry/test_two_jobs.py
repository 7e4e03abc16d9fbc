"""A client that holds two jobs at once: each job's telemetry has the client's rows for that job
(its ``<root>`` actor, the meshes it made there, the casts it sent there) and none of the other's,
and the client's own rows (a metric it adds while holding both) reach both.

It used to push everything the client recorded to the first host it ever used, so the second job's
tables lacked the client's rows altogether."""

import time

import monarch.actor
from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob, TelemetryConfig


class Idle(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def _rows(state, sql: str, n: int) -> list:
    """The rows of ``sql`` once there are at least ``n`` (the client pushes a few times a second)."""
    rows: list = []
    for _ in range(150):
        rows = state.query_engine_client.query(sql)["rows"]
        if len(rows) >= n:
            break
        time.sleep(0.2)
    return rows


def test_each_of_two_jobs_in_one_client_has_the_clients_rows(no_leaked_processes):
    jobs = {tag: ProcessJob({"hosts": 1}).enable_telemetry(TelemetryConfig()) for tag in ("a", "b")}
    try:
        states = {tag: job.state(cached_path=None) for tag, job in jobs.items()}
        for tag, state in states.items():
            procs = state.hosts.spawn_procs(per_host={"gpus": 1}, name=f"twojobs_procs_{tag}")
            procs.spawn(f"twojobs_idle_{tag}", Idle).ping.call().get()
        # Recorded by the client outside any job, while it holds both.
        monarch.actor.get_meter().create_counter("twojobs.counter").add(7)

        for tag, state in states.items():
            other = "b" if tag == "a" else "a"
            meshes = _rows(state, "SELECT given_name FROM meshes WHERE given_name LIKE 'twojobs_%' "
                                  "ORDER BY given_name", 2)
            # Only the client records meshes: this job's two, not the other job's.
            assert [r["given_name"] for r in meshes] == [f"twojobs_idle_{tag}", f"twojobs_procs_{tag}"], tag
            roots = _rows(state, "SELECT full_name FROM actors WHERE display_name = '<root>'", 1)
            assert len(roots) == 1, (tag, roots)
            sent = _rows(state, "SELECT s.endpoint FROM sent_messages_ext s JOIN meshes m ON s.actor_mesh_id = m.id "
                                f"WHERE m.given_name = 'twojobs_idle_{tag}'", 1)
            assert [r["endpoint"] for r in sent] == ["ping"], tag
            # (Asked once: this job's own meshes came in the same pushes as the other's would have.)
            assert not state.query_engine_client.query(
                f"SELECT id FROM meshes WHERE given_name LIKE 'twojobs_%_{other}'")["rows"], tag
            metric = _rows(state, "SELECT value FROM metrics WHERE name = 'twojobs.counter'", 1)
            assert [r["value"] for r in metric] == [7.0], tag
        # Each job's <root> is its own runtime's (the client has one per job).
        roots = {tag: _rows(s, "SELECT full_name FROM actors WHERE display_name = '<root>'", 1)[0]["full_name"]
                 for tag, s in states.items()}
        assert roots["a"] != roots["b"]
    finally:
        for job in jobs.values():
            job.kill()
