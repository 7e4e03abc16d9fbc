"""monarch.config: configure / configured / get_global_config with Monarch's names, and that a
setting reaches what it governs (a proc spawn that may not take long enough fails in time)."""

from __future__ import annotations

import pytest

from monarch import config
from monarch.actor import this_host


def test_layers_and_configured_restores():
    base = config.get_global_config()
    assert base["mesh_proc_spawn_max_idle"] == "120s" and base["stop_actor_timeout"] == "5s"
    with config.configured(stop_actor_timeout="30s", port_forward_connect_timeout=2) as merged:
        assert merged["stop_actor_timeout"] == "30s" and merged["port_forward_connect_timeout"] == "2s"
        assert config.get_runtime_config() == {"stop_actor_timeout": "30s", "port_forward_connect_timeout": "2s"}
        assert config.seconds("stop_actor_timeout") == 30.0
    assert config.get_global_config() == base and config.get_runtime_config() == {}
    assert config.seconds("stop_actor_timeout") == 5.0


def test_environment_layer(monkeypatch):
    monkeypatch.setenv("MONARCH_SPAWN_TIMEOUT", "90")
    assert config.get_global_config()["mesh_proc_spawn_max_idle"] == "90s"
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


@pytest.mark.parametrize("kwargs, match", [
    ({"enable_log_forwarding": True}, "monarch has no setting 'enable_log_forwarding'; it has: mesh_proc_spawn"),
    ({"stop_actor_timeout": "soon"}, "bad duration 'soon'"),
    ({"stop_actor_timeout": -1}, "cannot be negative"),
])
def test_bad_settings_change_nothing(kwargs, match):
    before = config.get_global_config()
    with pytest.raises(ValueError, match=match):
        config.configure(stop_actor_timeout="7s", **kwargs) if "stop_actor_timeout" not in kwargs else \
            config.configure(**kwargs)
    assert config.get_global_config() == before


def test_durations():
    assert config.parse_duration("1h 30m") == 5400 and config.parse_duration("250ms") == 0.25
    assert config.parse_duration(3) == 3.0 and config.parse_duration("2") == 2.0


def test_spawn_timeout_setting_reaches_spawn_procs():
    with config.configured(mesh_proc_spawn_max_idle="2m"):
        assert config.seconds("mesh_proc_spawn_max_idle") == 120.0
        config.configure(mesh_proc_spawn_max_idle="3m")
        assert config.seconds("mesh_proc_spawn_max_idle") == 180.0
        pm = this_host().spawn_procs()  # still spawns with the new limit
        pm.stop().get()
