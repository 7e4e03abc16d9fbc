"""monarch.config: configure / configured / get_global_config with Monarch's names, and that a
setting reaches what it governs (a proc spawn that may not take long enough fails in time)."""

from __future__ import annotations

import pytest

from monarch import config
from monarch.actor import Actor, endpoint, this_host


def test_layers_and_configured_restores():
    base = config.get_global_config()
    assert base["mesh_proc_spawn_max_idle"] == "2m" and base["stop_actor_timeout"] == "5s"  # shown as Monarch shows
    with config.configured(stop_actor_timeout="30s", port_forward_connect_timeout="2s") as merged:
        assert merged["stop_actor_timeout"] == "30s" and merged["port_forward_connect_timeout"] == "2s"
        assert config.get_runtime_config() == {"stop_actor_timeout": "30s", "port_forward_connect_timeout": "2s"}
        assert config.seconds("stop_actor_timeout") == 30.0
    assert config.get_global_config() == base and config.get_runtime_config() == {}
    assert config.seconds("stop_actor_timeout") == 5.0


def test_environment_layer(monkeypatch):
    monkeypatch.setenv("MONARCH_SPAWN_TIMEOUT", "90")  # seconds, in the environment only
    assert config.get_global_config()["mesh_proc_spawn_max_idle"] == "1m 30s"
    monkeypatch.setenv("MONARCH_SPAWN_TIMEOUT", "5m")  # the documented duration form
    assert config.seconds("mesh_proc_spawn_max_idle") == 300.0


def test_duration_in_the_environment_does_not_break_import():
    """`MONARCH_SPAWN_TIMEOUT=5m` made `import monarch.actor` raise (one place parsed it with float())."""
    import subprocess
    import sys

    code = "import monarch.actor; from monarch import config; print(config.seconds('mesh_proc_spawn_max_idle'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "MONARCH_SPAWN_TIMEOUT": "5m"})
    assert r.returncode == 0 and r.stdout.strip() == "300.0", r.stderr


def test_sync_stall_is_a_setting_and_a_bad_value_is_one_clear_error(monkeypatch):
    """`MONARCH_SYNC_STALL_S=soon` made importing the workspace engine raise (float() at import); it is
    now `sync_stall_timeout`, read when a sync is set up, and a bad value names the variable."""
    import os
    import subprocess
    import sys

    code = "import monarch._workbench.workspace, monarch.remotemount; print('imported')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MONARCH_SYNC_STALL_S": "soon"})
    assert r.returncode == 0 and r.stdout.strip() == "imported", r.stderr
    assert config.seconds("sync_stall_timeout") == 60.0
    monkeypatch.setenv("MONARCH_SYNC_STALL_S", "90")  # seconds, as before
    assert config.seconds("sync_stall_timeout") == 90.0
    monkeypatch.setenv("MONARCH_SYNC_STALL_S", "2m")
    assert config.seconds("sync_stall_timeout") == 120.0
    monkeypatch.setenv("MONARCH_SYNC_STALL_S", "soon")
    with pytest.raises(config.ConfigValueError, match=r"^MONARCH_SYNC_STALL_S='soon' \(sync_stall_timeout\): Invalid duration format"):
        config.seconds("sync_stall_timeout")
    from monarch._workbench.workspace import WorkspacePusher

    with pytest.raises(config.ConfigValueError, match="MONARCH_SYNC_STALL_S"):
        WorkspacePusher(None, "/", [])  # type: ignore[arg-type]  (fails before it uses the runtime)


def test_bad_setting_in_the_environment_is_one_line_and_usage_exit(tmp_path):
    """Through the CLI: one line naming the variable, the usage exit code, no traceback."""
    from tests.cli.conftest import monarch

    r = monarch("serve", cwd=tmp_path, env={"MONARCH_SERVE_STALL_TIMEOUT": "soon"})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: MONARCH_SERVE_STALL_TIMEOUT='soon'"), r.stderr
    assert "Traceback" not in r.stderr and len(lines) == 2  # the line and its hint
    assert not (tmp_path / ".monarch" / "job_state.pkl").exists()


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"mesh_orphan_timout": "1m"}, ValueError,
     "invalid configuration key: 'mesh_orphan_timout'; did you mean mesh_orphan_timeout"),
    ({"stop_actor_timeout": "soon"}, TypeError, "Invalid duration format 'soon'"),
    ({"stop_actor_timeout": "30"}, TypeError, "Invalid duration format '30': a unit is needed"),
    ({"stop_actor_timeout": -1}, TypeError, "stop_actor_timeout takes a duration string"),
    ({"stop_actor_timeout": "-1s"}, TypeError, "Invalid duration format"),
    ({"default_transport": 42}, TypeError, "default_transport takes a ChannelTransport"),
    ({"default_transport": "random_string"}, ValueError, "not a bind spec"),
    ({"enable_log_forwarding": "yes"}, TypeError, "enable_log_forwarding takes True or False"),
    ({"tail_log_lines": "3"}, TypeError, "tail_log_lines takes an integer"),
    ({"mesh_admin_addr": 1729}, TypeError, "mesh_admin_addr takes a string"),
])
def test_bad_settings_change_nothing(kwargs, exc, match):
    """A typo'd key raises ValueError and a value of the wrong form TypeError, as Monarch's configure
    does (ours is also a ValueError, as before); neither sets the other keys given with it."""
    before = config.get_global_config()
    with pytest.raises(exc, match=match) as info:
        config.configure(**({"stop_actor_timeout": "7s"} if "stop_actor_timeout" not in kwargs else {}), **kwargs)
    assert isinstance(info.value, ValueError)
    assert config.get_global_config() == before and config.get_runtime_config() == {}


def test_monarch_keys_and_value_forms_accepted():
    """Monarch's keys take Monarch's value forms; the ones with no mechanism here are shown, not applied."""
    with config.configured(message_delivery_timeout="1m 30s", mesh_orphan_timeout="2 weeks",
                           mesh_attach_config_timeout="500ms", enable_log_forwarding=True, tail_log_lines=10,
                           message_latency_sampling_rate=1, rdma_max_nics_per_buffer=None,
                           mesh_admin_addr="[::]:8080", default_transport="tcp") as merged:
        assert merged["message_delivery_timeout"] == "1m 30s" and merged["mesh_orphan_timeout"] == "14days"
        assert merged["enable_log_forwarding"] is True and merged["tail_log_lines"] == 10
        assert merged["message_latency_sampling_rate"] == 1.0 and merged["rdma_max_nics_per_buffer"] is None
        assert config.seconds("mesh_attach_config_timeout") == 0.5
    assert config.get_global_config()["message_delivery_timeout"] == "30s"  # Monarch's default
    applied = {k for k in config.get_global_config() if config.is_applied(k)}
    assert applied == {"mesh_proc_spawn_max_idle", "host_spawn_ready_timeout", "stop_actor_timeout",
                       "proc_stop_max_idle", "mesh_terminate_timeout", "port_forward_connect_timeout",
                       "serve_agent_start_max_idle", "sync_stall_timeout", "message_delivery_timeout",
                       "mesh_orphan_timeout", "mesh_attach_config_timeout", "mesh_admin_pyspy_bridge_timeout",
                       "mesh_admin_config_dump_bridge_timeout", "mesh_admin_pyspy_max_profile_duration",
                       "mesh_admin_addr", "mesh_admin_tree_timeout", "codec_max_frame_length"}
    assert not config.is_applied("channel_reconnect_timeout") and not config.is_applied("rdma_qps_per_cq")


def test_same_keys_as_torchmonarch():
    """Every key torchmonarch 0.7.0's get_global_config shows is one of ours (where it is installed)."""
    import json
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    py = os.environ.get("TORCHMONARCH_PYTHON") or os.path.join(root, ".tm-venv", "bin", "python")
    if not os.path.exists(py):
        pytest.skip("torchmonarch 0.7.0 is not installed here (TORCHMONARCH_PYTHON or a .tm-venv at the root)")
    code = "import json, monarch.config as c; print(json.dumps([sorted(c.get_global_config()), c.__all__]))"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr
    keys, names = json.loads(r.stdout.splitlines()[-1])
    assert set(keys) - set(config.get_global_config()) == set()
    assert set(names) - set(config.__all__) == set()


@config.parametrize_config(stop_actor_timeout={"1s", "2s"}, enable_log_forwarding={True, False})
def test_parametrize_config(request):
    """Four runs, each under its own combination; the setting is back to its default afterwards."""
    overrides = request.node.callspec.params["_monarch_config"]
    assert config.get_runtime_config() == overrides
    assert config.seconds("stop_actor_timeout") in (1.0, 2.0)


@pytest.mark.asyncio
@config.parametrize_config_pointwise(stop_actor_timeout=["1s", "2s"], tail_log_lines=[1, 2])
async def test_parametrize_config_pointwise():
    assert config.seconds("stop_actor_timeout") == config.get_global_config()["tail_log_lines"]


def test_parametrize_checks_keys_and_lengths_at_once():
    with pytest.raises(ValueError, match="invalid configuration key: 'stop_actor_timout'"):
        config.parametrize_config(stop_actor_timout={"1s"})
    with pytest.raises(ValueError, match="as many values for every key"):
        config.parametrize_config_pointwise(stop_actor_timeout=["1s"], tail_log_lines=[1, 2])


def test_encoding():
    assert config.get_global_config()["default_encoding"] is config.Encoding.Multipart
    with config.configured(default_encoding=config.Encoding.Json) as merged:
        assert merged["default_encoding"] is config.Encoding.Json
    with pytest.raises(TypeError, match="default_encoding takes a monarch.config.Encoding"):
        config.configure(default_encoding="json")


def test_durations():
    assert config.parse_duration("1h 30m") == 5400 and config.parse_duration("250ms") == 0.25
    assert config.parse_duration(3) == 3.0 and config.parse_duration("2") == 2.0
    assert config.parse_duration("2 weeks") == 14 * 86400 and config.parse_duration("1hour 2mins 3secs") == 3723
    assert config.parse_duration("4us") == pytest.approx(4e-6)


def test_spawn_timeout_setting_reaches_spawn_procs():
    with config.configured(mesh_proc_spawn_max_idle="2m"):
        assert config.seconds("mesh_proc_spawn_max_idle") == 120.0
        config.configure(mesh_proc_spawn_max_idle="3m")
        assert config.seconds("mesh_proc_spawn_max_idle") == 180.0
        pm = this_host().spawn_procs()  # still spawns with the new limit
        pm.stop().get()


def _stopped(pid: int):
    """SIGSTOP ``pid`` for the block (it takes no message meanwhile), SIGCONT after, whatever happens."""
    import contextlib
    import os
    import signal

    @contextlib.contextmanager
    def block():
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # killed while stopped (SIGKILL needs no cooperation)
    return block()


def test_stop_actor_timeout_bounds_the_wait_for_each_proc():
    """A proc that takes no message (SIGSTOPped) holds a mesh's stop for stop_actor_timeout: under
    "10m" the stop is still waiting after seconds, and ends once the proc runs again; under "250ms"
    it ends while the proc is still stopped."""
    from tests.monarch.actors import Worker

    for limit in ("10m", "250ms"):
        with config.configured(stop_actor_timeout=limit):
            pm = this_host().spawn_procs(per_host={"gpus": 1})
            pid = pm.spawn("w", Worker).pid.call_one().get()
            with _stopped(pid):
                stop = pm.stop()
                if limit == "10m":
                    with pytest.raises(TimeoutError):
                        stop.get(timeout=3)  # the proc cannot answer: the stop waits for it
                else:
                    stop.get(timeout=120)  # gave up on the proc after 250ms (its host ends it)
            stop.get(timeout=120)



def test_stop_actor_timeout_is_one_deadline_for_all_procs():
    """Four procs that take no message hold a mesh's stop for stop_actor_timeout once, not once each:
    the stop has ended before three times the timeout, when waiting for each proc in turn (each with
    its own timeout) could not end before four times it."""
    import contextlib

    from tests.monarch.actors import Worker

    limit_s, n = 10.0, 4
    with config.configured(stop_actor_timeout=f"{int(limit_s)}s"):
        pm = this_host().spawn_procs(per_host={"gpus": n})
        pids = pm.spawn("w", Worker).pid.call().get()
        pids = [pid for _, pid in pids.items()]
        assert len(set(pids)) == n
        with contextlib.ExitStack() as stack:
            for pid in pids:
                stack.enter_context(_stopped(pid))
            stop = pm.stop()
            stop.get(timeout=(n - 1) * limit_s)  # no proc answers: one shared wait of limit_s, then its host ends them
        stop.get(timeout=120)


_SCRIPT = r"""
import os, signal, sys
from monarch import config
from monarch.actor import Actor, endpoint, this_host
from monarch.actor import _client
from tests.monarch.actors import Worker

what, value = sys.argv[1], sys.argv[2]
config.configure(**{what: value})
if what == "proc_stop_max_idle":
    config.configure(stop_actor_timeout="250ms")
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    pm.spawn("w", Worker).pid.call_one().get()
    agent = _client._local_proc.proc.pid
    os.kill(agent, signal.SIGSTOP)  # the host cannot answer StopProcs
    try:
        stop = pm.stop()
        try:
            stop.get(timeout=float(sys.argv[3]))
            print("stopped while the host was stopped")
        except TimeoutError:
            print("still waiting for the host")
    finally:
        os.kill(agent, signal.SIGCONT)
    stop.get(timeout=120)
    print("stopped")
else:
    try:
        this_host().spawn_procs(per_host={"gpus": 1}).stop().get()
        print("spawned")
    except Exception as e:
        print(f"{type(e).__name__}: {e}")
"""


def _run(*args: str, env: dict | None = None) -> str:
    """``_SCRIPT`` with ``args`` in a fresh client with a private host agent (one it may stop)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, timeout=300,
                       cwd=root, env={**os.environ, "MONARCH_SHARED_AGENT": "0", **(env or {})})
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_proc_stop_max_idle_bounds_the_wait_for_each_host():
    """A host agent that takes no message holds a mesh's stop for proc_stop_max_idle."""
    assert _run("proc_stop_max_idle", "10m", "3").splitlines() == ["still waiting for the host", "stopped"]
    assert _run("proc_stop_max_idle", "250ms", "120").splitlines() == ["stopped while the host was stopped", "stopped"]


def test_spawn_and_host_ready_timeouts_reach_a_real_spawn():
    """mesh_proc_spawn_max_idle and host_spawn_ready_timeout bound their waits: zero fails at once
    with the setting's name, in configure and in Monarch's environment variable alike."""
    out = _run("mesh_proc_spawn_max_idle", "0s")
    assert out.startswith("SupervisionError: host ") and "did not start 1 procs within 0 s" in out
    out = _run("host_spawn_ready_timeout", "0s")
    assert "RuntimeError: the local host agent did not start within 0 s" in out and "host_spawn_ready_timeout" in out
    out = _run("stop_actor_timeout", "5s", env={"HYPERACTOR_HOST_SPAWN_READY_TIMEOUT": "0s"})
    assert "host_spawn_ready_timeout" in out
    assert _run("host_spawn_ready_timeout", "2m").strip() == "spawned"


class _Settings(Actor):
    @endpoint
    def seen(self) -> tuple[dict, dict]:
        from monarch import config as theirs

        g = theirs.get_global_config()
        return ({k: g[k] for k in ("stop_actor_timeout", "mesh_orphan_timeout", "default_encoding", "tail_log_lines")},
                theirs.get_runtime_config())


def test_procs_see_the_settings_of_their_client_at_spawn():
    """As in Monarch, a proc starts with its client's settings as they were at spawn_procs; what the
    client sets later reaches the procs it spawns later, not those already running."""
    with config.configured(stop_actor_timeout="77s", mesh_orphan_timeout=None, default_encoding=config.Encoding.Json):
        first = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            seen, runtime = first.spawn("s", _Settings).seen.call_one().get()
            assert seen == {"stop_actor_timeout": "1m 17s", "mesh_orphan_timeout": None,
                            "default_encoding": config.Encoding.Json, "tail_log_lines": 0}
            assert runtime == {}  # inherited, not set there
            config.configure(stop_actor_timeout="78s", tail_log_lines=5)
            second = this_host().spawn_procs(per_host={"gpus": 1})
            try:
                assert second.spawn("s", _Settings).seen.call_one().get()[0]["stop_actor_timeout"] == "1m 18s"
                assert first.spawn("t", _Settings).seen.call_one().get()[0]["stop_actor_timeout"] == "1m 17s"
            finally:
                second.stop().get()
        finally:
            first.stop().get()


class _SlowCleanup(Actor):
    """Its ``__cleanup__`` lasts until ``release`` exists (a stop can be held as long as a test likes)."""

    def __init__(self, release: str):
        self.release = release

    @endpoint
    def ready(self) -> bool:
        return True

    def __cleanup__(self, exc):
        import os
        import time

        for _ in range(6000):  # ten minutes at most: never a proc left behind
            if os.path.exists(self.release):
                return
            time.sleep(0.1)


def test_a_proc_waits_for_its_actors_as_its_clients_stop_actor_timeout_said(tmp_path):
    """stop_actor_timeout also bounds how long a proc waits for each of its actors to stop (the
    proc's own limit, inherited at spawn): spawned under "250ms", a proc whose actor's cleanup
    hangs ends its stop even though the client now waits "10m"; spawned under "10m" it waits."""
    for at_spawn in ("10m", "250ms"):
        release = tmp_path / f"release-{at_spawn}"
        with config.configured(stop_actor_timeout=at_spawn):
            pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            assert pm.spawn("c", _SlowCleanup, str(release)).ready.call_one().get()
            with config.configured(stop_actor_timeout="10m"):
                stop = pm.stop()
                if at_spawn == "10m":
                    with pytest.raises(TimeoutError):
                        stop.get(timeout=8)  # the proc waits for the cleanup, past the 5 s default
                else:
                    stop.get(timeout=120)  # the proc gave up on it after 250ms
        finally:
            release.touch()
        stop.get(timeout=120)


def test_mesh_terminate_timeout_is_the_grace_after_sigterm():
    """A proc that cannot act on SIGTERM (SIGSTOPped) is SIGKILLed mesh_terminate_timeout after it:
    under "250ms" it is gone while still stopped; under "10m" it is still there seconds later,
    and ends on the SIGTERM once it runs again."""
    from tests.helpers import alive, wait_gone
    from tests.monarch.actors import Worker

    for grace in ("250ms", "10m"):
        with config.configured(stop_actor_timeout="250ms", mesh_terminate_timeout=grace):
            pm = this_host().spawn_procs(per_host={"gpus": 1})
            pid = pm.spawn("w", Worker).pid.call_one().get()
            with _stopped(pid):
                pm.stop().get(timeout=120)
                if grace == "250ms":
                    assert wait_gone([pid]) == []  # SIGKILL needs no cooperation
                else:
                    import time

                    time.sleep(3)
                    assert alive(pid)  # the SIGTERM waits for it to run; the SIGKILL for 10 minutes
            assert wait_gone([pid]) == []


def test_every_setting_that_governs_nothing_is_explained_in_the_readme():
    """README's list of Monarch's settings that govern nothing here names each one (and no applied one)."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "README.md")) as f:
        text = f.read()
    part = text[text.index("govern nothing here\n(`is_applied(key)` is False)"):]
    part = part[:part.index("\n\n", part.index("| settings |"))]
    first_cells = [row.split("|")[1] for row in part.splitlines() if row.startswith("| `")]
    named = {k for cell in first_cells for k in re.findall(r"`([a-z_]+)`", cell)}
    unapplied = {k for k in config.get_global_config() if not config.is_applied(k)}
    assert named == unapplied
