"""The public names of ``monarch.actor`` and ``monarch.job`` are pinned: a name may be added here on
purpose, never dropped or renamed by accident (Monarch programs import them by name)."""

from __future__ import annotations

import importlib

import pytest

ACTOR = {
    "Accumulator", "Actor", "ActorError", "ActorMesh", "Channel", "Context", "Endpoint", "Extent", "Future",
    "HostMesh", "MeshFailure", "NotAnEndpoint", "Point", "Port", "PortReceiver", "ProcMesh", "RankedPortReceiver",
    "SupervisionError", "ValueMesh", "as_endpoint", "concurrent_endpoint", "context", "current_actor_name",
    "current_rank", "current_size", "endpoint", "get_or_spawn_controller", "send", "this_host", "this_proc",
    "unhandled_fault_hook",
}
JOB = {
    "DEFAULT_JOB_PATH", "Job", "JobSpec", "JobState", "JobTrait", "LocalJob", "PortForwarder", "ProcessJob",
    "SlurmJob", "exec_command", "job_load", "job_loads", "load_current_job", "set_current_job", "shell",
}


@pytest.mark.parametrize("module,names", [("monarch.actor", ACTOR), ("monarch.job", JOB)])
def test_public_names_are_pinned_and_resolve(module, names):
    mod = importlib.import_module(module)
    assert set(mod.__all__) == names, f"{module}.__all__ changed: update this test on purpose"
    for name in names:
        assert getattr(mod, name) is not None, f"{module}.{name} does not resolve"


def test_the_engine_is_private():
    """Monarch's job API lives in monarch.job; the engine under it is monarch._workbench (no public name)."""
    import monarch.job

    for name in ("reserve", "run", "state", "logs", "workspace", "telemetry"):
        assert not hasattr(monarch.job, name) or name in JOB
        importlib.import_module(f"monarch._workbench.{name}")
