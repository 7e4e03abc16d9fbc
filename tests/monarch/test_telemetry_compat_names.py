"""Monarch's telemetry names that programs import: monarch.distributed_telemetry.engine.QueryEngine and
monarch._src.job.telemetry_actor (compatibility only), and JobState.query_engine being None as Monarch's."""

import os

import pytest

import monarch._src.job.telemetry_actor as ta
from monarch.distributed_telemetry.engine import QueryEngine
from monarch._workbench.job_services import QueryEngine as OurEngine


def test_query_engine_is_ours():
    assert QueryEngine is OurEngine


def _frame(table: str, t) -> bytes:
    import struct

    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    payload = sink.getvalue().to_pybytes()
    return struct.pack(">H", len(table)) + table.encode() + struct.pack(">I", len(payload)) + payload


@pytest.fixture
def own_tmp(monkeypatch):
    """The collector's temp folder is this test's (short: a socket's path has 107 bytes at most),
    not the machine's /tmp, where it would leave the per-user folder behind."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="tel-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_an_activated_telemetry_actor_keeps_the_rows_written_to_its_socket(own_tmp):
    import socket
    import time
    import uuid

    import pyarrow as pa

    apply_id = f"test-{uuid.uuid4().hex}"
    actor = ta.TelemetryActor(apply_id, retention_secs=0)
    assert isinstance(actor, ta.Actor)
    with pytest.raises(RuntimeError, match="not an active telemetry collector"):
        actor._scanner_or_raise()
    try:
        assert actor._activate_impl() and actor._activate_impl()  # the second: already serving
        path = ta.telemetry_socket_path(apply_id)
        # The per-user folder too, not only the job's inside it (it was 0755 under the usual umask).
        for d in (ta.telemetry_socket_dir(apply_id), os.path.dirname(ta.telemetry_socket_dir(apply_id))):
            assert os.stat(d).st_mode & 0o777 == 0o700, d
        assert os.stat(path).st_mode & 0o777 == 0o600
        # Monarch's frames of its actors table (its columns, u64 ids: one past 2**63, kept bit for bit as
        # our signed ids) and of a table not kept here.
        actors = pa.table({"id": pa.array([2**64 - 7], pa.uint64()), "timestamp_us": [1], "mesh_id": pa.array([3], pa.uint64()),
                           "rank": pa.array([0], pa.uint64()), "full_name": ["w-1[0]"], "display_name": ["w[0]"]})
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(path)
            c.sendall(_frame("span_events", pa.table({"id": [1]})) + _frame("actors", actors))
        rows: list = []
        for _ in range(500):
            rows = [r for b in actor._scanner_or_raise().batches("actors") for r in b.to_pylist()]
            if rows:
                break
            time.sleep(0.01)
        assert rows == [{"id": -7, "timestamp_us": 1, "mesh_id": 3, "rank": 0, "full_name": "w-1[0]",
                         "display_name": "w[0]"}]
        # A second collector of the same job finds this one live and does not take its socket.
        other = ta.TelemetryActor(apply_id, retention_secs=0)
        assert other._activate_impl() is False and other._scanner is None
        with pytest.raises(RuntimeError, match="not an active telemetry collector"):
            other._scanner_or_raise()
    finally:
        actor.close()
        import shutil

        shutil.rmtree(ta.telemetry_socket_dir(apply_id), ignore_errors=True)
    assert not os.path.exists(ta.telemetry_socket_path(apply_id))


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
