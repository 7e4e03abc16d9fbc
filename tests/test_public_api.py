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
    # Monarch's worker bootstrap, identities, transports, tracing and client lifetime (issue #26)
    "ChannelTransport", "ProcId", "Uid", "attach", "attach_to_workers", "config", "debug_controller",
    "default_bootstrap_cmd", "enable_transport", "get_meter", "hosts_from_config", "returns_future",
    "run_worker_loop_forever", "run_worker_loop_until_shutdown", "shutdown_context", "span",
    "start_worker_loop_forever", "traced",
}
JOB = {
    "DEFAULT_JOB_PATH", "Job", "JobSpec", "JobState", "JobTrait", "LocalJob", "PortForwarder", "ProcessJob",
    "SlurmJob", "exec_command", "job_load", "job_loads", "load_current_job", "set_current_job", "shell",
    # Monarch's job services and service identities (issue #26)
    "MeshAdminConfig", "TelemetryConfig", "hosts_from_config", "new_service_proc_id", "SERVICE_PROC_IDS_ENV",
    "SERVICE_PROC_RANK_ENV", "deserialize_service_proc_ids", "ranked_service_proc_id_from_env",
    "serialize_service_proc_ids", "service_proc_addr", "service_proc_addrs",
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
