"""Monarch's telemetry names that programs import: monarch.distributed_telemetry.engine.QueryEngine and
monarch._src.job.telemetry_actor (compatibility only), and JobState.query_engine being None as Monarch's."""

import os

import pytest

import monarch._src.job.telemetry_actor as ta
from monarch.distributed_telemetry.engine import QueryEngine
from monarch._workbench.job_services import QueryEngine as OurEngine


def test_query_engine_is_ours():
    assert QueryEngine is OurEngine


def test_telemetry_actor_is_an_actor_that_says_where_telemetry_is():
    actor = ta.TelemetryActor("apply-1", retention_secs=0)
    assert isinstance(actor, ta.Actor)
    assert actor._activate_impl() is False and actor._worker_collectors == []
    with pytest.raises(RuntimeError, match="not an active telemetry collector.*query_engine_client"):
        actor._scanner_or_raise()


def test_socket_paths_are_the_users_own():
    d = ta.telemetry_socket_dir("apply-2")
    assert str(os.getuid()) in d and ta.telemetry_socket_path("apply-2").startswith(d + os.sep)


def test_the_scan_worker_timeout_bounds_each_hosts_scan_of_a_job_query(no_leaked_processes, monkeypatch):
    """Monarch's ``_SCAN_WORKER_TIMEOUT_SECS`` is read at each query: a host that does not answer within
    it is left out and the query still answers (here the host agent is stopped with SIGSTOP)."""
    import signal

    from monarch.job import ProcessJob, TelemetryConfig

    job = ProcessJob({"hosts": 1}).enable_telemetry(TelemetryConfig())
    state = job.state(cached_path=None)
    q = state.query_engine_client.query
    try:
        [row] = q("SELECT agent_pid FROM hosts")["rows"]
        agent = row["agent_pid"]
        monkeypatch.setattr(ta, "_SCAN_WORKER_TIMEOUT_SECS", 0.5)
        os.kill(agent, signal.SIGSTOP)
        try:
            assert q("SELECT count(*) AS n FROM hosts", timeout=30)["rows"] == [{"n": 0}]
        finally:
            os.kill(agent, signal.SIGCONT)
        assert q("SELECT count(*) AS n FROM hosts")["rows"] == [{"n": 1}]
    finally:
        job.kill()
