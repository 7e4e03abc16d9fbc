"""A py-spy result taken elsewhere is kept in the job's telemetry (``store_pyspy_dump``), as Monarch's
telemetry service keeps one: its frames in ``pyspy_frames``, its locals in ``pyspy_local_variables``, its
proc reference in ``pyspy_dumps``."""

import json
import urllib.error

import pytest

from monarch.job import ProcessJob, TelemetryConfig


def _result(pid: int, frames: list) -> str:
    return json.dumps({"Ok": {"pid": pid, "binary": "python3", "warnings": [], "stack_traces": [
        {"pid": pid, "thread_id": 5, "thread_name": "MainThread", "os_thread_id": 50, "active": True,
         "owns_gil": True, "frames": frames}]}})


def _frame(name: str, line: int, local_vars: list) -> dict:
    return {"name": name, "filename": f"{name}.py", "module": name, "short_filename": f"{name}.py", "line": line,
            "locals": local_vars, "is_entry": False}


def test_a_stored_dump_is_queryable_with_its_locals_and_proc_ref(no_leaked_processes):
    job = ProcessJob({"hosts": 1}).enable_telemetry(TelemetryConfig())
    state = job.state(cached_path=None)
    try:
        client = state.query_engine_client
        result = _result(4321, [
            _frame("inner", 7, [{"name": "b", "addr": 16, "arg": False, "repr": None},
                                {"name": "a", "addr": 8, "arg": True, "repr": "1"}]),
            _frame("outer", 3, [{"name": "c", "addr": 24, "arg": True, "repr": "'x'"}])])
        assert client.store_pyspy_dump("d-1", "somewhere.proc[3]", result) == {"status": "ok"}
        # Answered once the job's tables hold it: no waiting here.
        q = client.query
        assert q("SELECT name, line FROM pyspy_frames WHERE dump_id = 'd-1' ORDER BY frame_depth")["rows"] == [
            {"name": "inner", "line": 7}, {"name": "outer", "line": 3}]
        assert q("SELECT frame_depth, name, addr, arg, repr FROM pyspy_local_variables WHERE dump_id = 'd-1' "
                 "ORDER BY frame_depth, name")["rows"] == [
            {"frame_depth": 0, "name": "a", "addr": 8, "arg": True, "repr": "1"},
            {"frame_depth": 0, "name": "b", "addr": 16, "arg": False, "repr": None},
            {"frame_depth": 1, "name": "c", "addr": 24, "arg": True, "repr": "'x'"}]
        assert q("SELECT pid, proc_ref FROM pyspy_dumps WHERE dump_id = 'd-1'")["rows"] == [
            {"pid": 4321, "proc_ref": "somewhere.proc[3]"}]
        # What is no PySpyResult is refused, in one line, and nothing is kept.
        with pytest.raises(urllib.error.HTTPError) as bad:
            client.store_pyspy_dump("d-2", "p", "not json")
        assert bad.value.code == 400
        assert q("SELECT count(*) AS n FROM stacks WHERE dump_id = 'd-2'")["rows"] == [{"n": 0}]
    finally:
        job.kill()
