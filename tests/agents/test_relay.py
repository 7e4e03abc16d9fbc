"""The relay that stands in, inside a cluster, for a client reaching it only through port-forwards
(``monarch_agents.services.relay``), over real sockets."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest

from monarch_agents import tunnel
from monarch_agents.keys import JobKeys
from monarch_agents.services.relay import RelayService


def _start_relay() -> tuple[RelayService, JobKeys, int]:
    """A relay service on a free loopback port, for a stand-in agent of a new job."""
    keys = JobKeys.generate()
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    agent = SimpleNamespace(keys=keys, relay_port=port, rt=SimpleNamespace(mailbox=SimpleNamespace(bind_host="127.0.0.1")))
    return RelayService(agent), keys, port


@pytest.fixture
def relay():
    service, keys, port = _start_relay()
    yield service, keys, port
    service.stop(time.monotonic() + 1)


def _request(port: int, obj: dict) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    tunnel.send_line(s, obj)
    return s


def test_a_pod_connection_reaches_the_client_through_its_stream(relay):
    service, keys, port = relay
    control = _request(port, {"token": tunnel.token(keys), "listen": True})
    stand_in = tunnel.read_line(control)["port"]
    pod = socket.create_connection(("127.0.0.1", stand_in), timeout=5)
    n = tunnel.read_line(control)["conn"]
    back = _request(port, {"token": tunnel.token(keys), "accept": n})
    pod.sendall(b"hello from a pod")
    assert back.recv(100) == b"hello from a pod"
    back.sendall(b"hello from the client")
    assert pod.recv(100) == b"hello from the client"
    assert service.info() == {"port": port, "clients": 1, "tunnels": 1, "shed": 0}
    # The client process ends: its stand-in address closes with it.
    control.close()
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", stand_in), timeout=1).close()
        except ConnectionRefusedError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the stand-in port outlived its client")
    for s in (pod, back):
        s.close()


def test_requests_without_the_jobs_token_get_nothing(relay):
    _, keys, port = relay
    other = JobKeys.generate()
    for req in ({"token": tunnel.token(other), "listen": True}, {"listen": True}, {"token": tunnel.token(other), "accept": 1}):
        s = _request(port, req)
        assert s.recv(100) == b""  # closed, no answer
        s.close()
    s = _request(port, {"token": tunnel.token(keys), "accept": 12345})  # no such announced connection
    assert s.recv(100) == b""
    s.close()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\xff" * 5000)  # no line at all: dropped (closed, or reset over the unread bytes)
    try:
        assert s.recv(100) == b""
    except ConnectionResetError:
        pass
    s.close()
    control = _request(port, {"token": tunnel.token(keys), "listen": True})
    assert "port" in tunnel.read_line(control)
    control.close()


def test_a_proc_cannot_make_the_token():
    keys = JobKeys.generate()
    assert tunnel.token(keys.for_procs()) != tunnel.token(keys)


def test_a_taken_port_leaves_the_agent_serving_and_says_why():
    taken = socket.create_server(("127.0.0.1", 0))
    agent = SimpleNamespace(keys=JobKeys.generate(), relay_port=taken.getsockname()[1],
                            rt=SimpleNamespace(mailbox=SimpleNamespace(bind_host="127.0.0.1")))
    service = RelayService(agent)
    try:
        assert "cannot listen on port" in service.info()["error"]
    finally:
        service.stop(time.monotonic() + 1)
        taken.close()


def test_idle_connections_neither_fill_the_relay_nor_keep_the_client_out(relay):
    """Anyone who can reach the port may open connections and send nothing: once 16 wait, one more
    closes the oldest (a relay that refused the newest kept the client out for as long as they held)."""
    service, keys, port = relay
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(24)]
    try:
        control = _request(port, {"token": tunnel.token(keys), "listen": True})
        assert tunnel.read_line(control)["port"]  # the client got in, after the 24
        assert service.info()["shed"] >= 24 + 1 - 16
        closed = 0
        for s in idle[:8]:  # the oldest were the ones closed
            s.settimeout(5)
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == 8
        control.close()
    finally:
        for s in idle:
            s.close()


def test_stop_closes_the_client_control_streams_and_joins_its_threads():
    """A client still connected when the relay stops: its control stream is closed (the client sees
    the end), its stand-in port with it, and no thread of the relay's is left reading it."""
    service, keys, port = _start_relay()
    control = _request(port, {"token": tunnel.token(keys), "listen": True})
    try:
        stand_in = tunnel.read_line(control)["port"]
        service.stop(time.monotonic() + 60)
        assert [t.name for t in service._threads if t.is_alive()] == []  # joined by the deadline
        control.settimeout(60)
        assert control.recv(1) == b""
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", stand_in), timeout=5).close()
    finally:
        control.close()


def test_a_client_silent_past_its_heartbeat_is_gone_and_its_port_closed(relay):
    """A client that promised a heartbeat and then went silent without closing (a port-forward whose
    far end vanished keeps this end open) loses its control stream and stand-in port: neither is
    held for the agent's lifetime."""
    service, keys, port = relay
    control = _request(port, {"token": tunnel.token(keys), "listen": True, "heartbeat": 0.1})
    try:
        stand_in = tunnel.read_line(control)["port"]
        control.settimeout(120)  # a hang bound only: the relay closes it after 4 missed beats
        assert control.recv(1) == b""
        while service.info()["clients"]:  # the relay's thread for it is ending
            time.sleep(0.02)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", stand_in), timeout=5).close()
    finally:
        control.close()

