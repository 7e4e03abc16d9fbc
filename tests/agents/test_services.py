"""The host agent's services: status per service, a plugged-in service, and the ordered stop."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest

from monarch_agents import messages as m
from tests.agents.echo_service import Echo
from tests.helpers import StreamInbox, start_host_agent, wait_gone

pytestmark = pytest.mark.timeout(60)

T = 30




def _ping(client, agent) -> m.HostInfo:
    return client.request(agent.addr, lambda port: m.Ping(port)).get(timeout=T)


def _run(client, agent, stream: StreamInbox, argv) -> str:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    client.send(agent.addr, m.RunCommand(run_id, argv, {}, None, stream.port.ref, 0, client.addr))
    return run_id


@pytest.fixture
def plugged(client, tmp_path):
    a = start_host_agent(client.keys, tmp_path, hostname="plugged", module="tests.agents.echo_service")
    yield a
    a.stop()
    assert wait_gone([a.pid] + a.children()) == []


def test_status_has_every_service(client, plugged):
    stream = StreamInbox(client)
    run_id = _run(client, plugged, stream, ["sh", "-c", "echo up; exec sleep 30"])
    assert stream.next(m.RunOutput).data == b"up\n"
    info = _ping(client, plugged)
    assert set(info.services) == {"echo", "workspace", "debug", "procs", "runs", "shells", "telemetry", "relay", "fanout"}
    assert [r["run_id"] for r in info.runs] == [run_id] and info.procs == []
    assert info.services["shells"] == {"shells": 0} and info.services["echo"] == {"echoed": 0}
    client.send(plugged.addr, m.SignalRun(run_id, signal.SIGKILL))
    assert stream.next(m.RunExited).reason == "killed by SIGKILL"
    assert _ping(client, plugged).runs == []


def test_a_plugged_service_handles_its_messages_off_the_io_thread(client, plugged):
    text, thread = client.request(plugged.addr, lambda port: Echo("hi", port)).get(timeout=T)
    assert (text, thread) == ("hi", "service-echo")
    assert _ping(client, plugged).services["echo"] == {"echoed": 1}


def test_ordered_stop_ends_runs_before_the_next_service_and_exits_normally(client, plugged):
    """Shutdown with a rank that ignores SIGTERM: it is killed within the deadline, its owner hears
    why, the service listed first stops last (no child left by then), and the process exits normally."""
    stream = StreamInbox(client)
    _run(client, plugged, stream, ["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"])
    assert stream.next(m.RunOutput).data == b"up\n"
    children = plugged.children()
    assert client.request(plugged.addr, lambda port: m.Shutdown(port)).get(timeout=T) is True
    exited = stream.next(m.RunExited)
    assert exited.reason.startswith("killed by SIGKILL") and "shutting down" in exited.reason
    assert plugged.proc.wait(timeout=T) == 0
    assert wait_gone(children) == []
    log_dir = os.path.join(os.path.dirname(plugged.log_path), "logs")
    with open(os.path.join(log_dir, "echo-stop.json")) as f:
        seen = json.load(f)
    assert seen["children"] == 0 and seen["runs"] == 0 and seen["left_s"] > 0
    assert os.path.exists(os.path.join(log_dir, "exited-normally"))


def test_sigterm_stops_the_agent_in_order(client, plugged):
    stream = StreamInbox(client)
    _run(client, plugged, stream, ["sh", "-c", "echo up; exec sleep 30"])
    assert stream.next(m.RunOutput).data == b"up\n"
    children = plugged.children()
    os.kill(plugged.pid, signal.SIGTERM)
    exited = stream.next(m.RunExited)
    assert exited.reason == "killed by SIGTERM (its host agent is shutting down: the reservation was released)"
    assert plugged.proc.wait(timeout=T) == 0
    assert wait_gone(children) == []


def test_a_proc_configuration_is_written_whole_before_any_reader_exists():
    # The host agent writes an exec'd proc's configuration before the proc starts: it must never
    # wait for a reader, so the pipe is grown to hold it, or the write is refused at once.
    from monarch_agents.services.procs import _fill_pipe

    data = os.urandom(300_000)
    r, w = os.pipe()
    try:
        _fill_pipe(w, data)
        os.close(w)
        w = -1
        got = bytearray()
        while chunk := os.read(r, 1 << 20):
            got += chunk
        assert bytes(got) == data
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    with open("/proc/sys/fs/pipe-max-size") as f:
        too_big = int(f.read()) * 2
    r, w = os.pipe()
    try:
        with pytest.raises(OSError):
            _fill_pipe(w, bytes(too_big))
    finally:
        os.close(r)
        os.close(w)
