"""What the job API adds to meshes (Monarch's names): spawn_procs(proc_bind=), HostMesh.shutdown/stop
and use as a context manager, with_python_executable, ProcMesh.logging_option, mesh._labels, and
monarch.spmd's torch elastic environment, against real procs of this process's host agent."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import pytest

from monarch.actor import Actor, SupervisionError, endpoint, this_host
from monarch.spmd import SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async


class Probe(Actor):
    @endpoint
    def env(self) -> dict:
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")
        return {k: os.environ.get(k) for k in keys}

    @endpoint
    def cpus(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    @endpoint
    def level(self) -> int:
        return logging.getLogger().level


def test_proc_bind_pins_each_proc_of_a_host():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    pm = this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": str(cpus[0])},
                                                                  {"physcpubind": str(cpus[1])}])
    try:
        assert list(pm.spawn("p", Probe).cpus.call().get().values()) == [[cpus[0]], [cpus[1]]]
    finally:
        pm.stop().get()


@pytest.mark.parametrize("bind, match", [
    ([{"cpus": "0"}], r"proc_bind length \(1\) must equal procs_per_host \(2\)"),
    ([{"cpus": "0"}, {"cores": "1"}], "unknown proc_bind key"),
    ([{"cpus": "0"}, {"cpus": "one"}], "bad CPU list"),
    ({"cpus": "0"}, "must be a list of dicts"),
])
def test_proc_bind_bad_input_fails_before_anything_is_bound(bind, match):
    with pytest.raises(ValueError, match=match):
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=bind)


def test_host_mesh_shutdown_stops_its_procs_and_the_context_manager_shuts_down():
    hm = this_host()
    probes = hm.spawn_procs(per_host={"gpus": 2}).spawn("p", Probe)
    assert len(probes.cpus.call().get()) == 2
    hm.shutdown().get()
    with pytest.raises(SupervisionError):
        probes.cpus.call().get(timeout=10)
    with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
        hm.spawn_procs()
    with this_host() as h:
        inner = h.spawn_procs().spawn("p", Probe)
        assert inner.level.call_one().get() is not None
    with pytest.raises(SupervisionError):
        inner.level.call_one().get(timeout=10)
    # stop() keeps the mesh usable.
    h2 = this_host()
    h2.spawn_procs()
    h2.stop().get()
    h2.spawn_procs().stop().get()


def test_with_python_executable_runs_procs_under_it_or_the_spawn_says_why_not():
    hm = this_host().with_python_executable(sys.executable)
    assert hm.hosts == this_host().hosts
    missing = this_host().with_python_executable("/no/such/python")
    with pytest.raises(Exception, match="failed to start"):
        missing.spawn_procs(per_host={"gpus": 1})


class EnvSize(Actor):
    @endpoint
    def length(self, name: str) -> int:
        return len(os.environ.get(name, ""))


def test_with_python_executable_hands_over_a_configuration_bigger_than_a_pipe(monkeypatch):
    # The client's environment rides in the proc's configuration on its stdin: 100 KiB of it is
    # more than a pipe holds unless the host agent grows the pipe before the proc starts.
    monkeypatch.setenv("REVIEW_TEST_BIG_VALUE", "x" * 100_000)
    pm = this_host().with_python_executable(sys.executable).spawn_procs(per_host={"gpus": 1})
    try:
        assert list(pm.spawn("e", EnvSize).length.call("REVIEW_TEST_BIG_VALUE").get(timeout=60).values()) == [100_000]
    finally:
        pm.stop().get()


def test_a_spawn_whose_environment_the_zygote_cannot_take_fails_in_one_line(monkeypatch):
    host = this_host()
    host.spawn_procs().stop().get()  # the host agent up before the environment grows
    # One datagram carries a start to the zygote: ~600 KiB of environment is more than it takes.
    monkeypatch.setenv("REVIEW_TEST_HUGE_VALUE", "x" * 100_000)
    for n in range(1, 6):
        monkeypatch.setenv(f"REVIEW_TEST_HUGE_VALUE_{n}", "x" * 100_000)
    for mesh in (host, host.with_python_executable(sys.executable)):
        with pytest.raises(Exception, match="failed to start.*too large"):
            mesh.spawn_procs(per_host={"gpus": 2})


def test_logging_option_sets_every_procs_level():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        asyncio.run(pm.logging_option(stream_to_client=True, aggregate_window_sec=3, level=logging.WARNING))
        assert list(pm.spawn("p", Probe).level.call().get().values()) == [logging.WARNING] * 2
        with pytest.raises(ValueError, match="stream_to_client is False"):
            asyncio.run(pm.logging_option(stream_to_client=False, aggregate_window_sec=3))
    finally:
        pm.stop().get()


def test_a_stopped_mesh_closes_its_log_clients_port():
    from monarch import config
    from monarch.actor._client import ensure_runtime

    with config.configured(enable_log_forwarding=True):
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            asyncio.run(pm.logging_option(stream_to_client=True, level=logging.INFO))
            client = pm._logging_manager._logging_mesh_client
            assert client is not None and client.port_id in ensure_runtime()._ports
        finally:
            pm.stop().get()
    assert client.port_id not in ensure_runtime()._ports


def test_setup_torch_elastic_env_as_torchrun_numbers_ranks():
    pm = this_host().spawn_procs(per_host={"nodes": 2, "gpus": 2})
    try:
        assert pm._labels == ["nodes", "gpus"]  # a list, as Monarch's
        setup_torch_elastic_env(pm)
        envs = list(pm.spawn("p", Probe).env.call().get().values())
        assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
            ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
        assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"], e["ROLE_NAME"]) for e in envs} == {
            ("4", "2", "2", "rank")}
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
        asyncio.run(setup_torch_elastic_env_async(pm, "10.0.0.1", 1234))
        assert {e["MASTER_PORT"] for e in pm.spawn("q", Probe).env.call().get().values()} == {"1234"}
        with pytest.raises(ValueError, match="both master_addr and master_port"):
            setup_torch_elastic_env(pm, master_addr="10.0.0.1")
    finally:
        pm.stop().get()


def test_spmd_actor_main_runs_a_script_per_proc(tmp_path):
    out = tmp_path / "out"
    script = tmp_path / "train.py"
    script.write_text("import os, sys\n"
                      f"open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').write(' '.join(sys.argv[1:]))\n")
    out.mkdir()
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        actors = pm.spawn("_SPMDActor", SPMDActor)
        addr, port = actors.slice(**dict.fromkeys(pm._labels, 0)).get_host_port.call_one(None).get()
        assert all(actors.main.call(addr, port, [str(script), "--lr", "0.1"]).get().values())
        assert sorted(os.listdir(out)) == ["0", "1"] and (out / "1").read_text() == "--lr 0.1"
        with pytest.raises(Exception, match="No script or module specified"):
            actors.main.call(addr, port, []).get()
    finally:
        pm.stop().get()
