"""PyTorch Monarch's TorchX commands (``monarch.tools.commands``: create, server_ready, info,
kill_and_confirm) on the real Slurm cluster: a job of two hosts with a workspace, dry-run then
submitted through TorchX's Slurm scheduler, described as a ``ServerSpec`` with its hostnames, then
cancelled.  This cluster keeps no accounting (``sacct``), so the job is described from ``squeue``
(``monarch.tools.config.defaults``' Slurm scheduler)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from tests.schedulers.conftest import squeue_state


@pytest.fixture
def tools_workdir(workdir, monkeypatch, tmp_path):
    monkeypatch.setenv("MONARCH_HOME", str(tmp_path / "home"))  # create()'s merged workspaces go there
    return workdir


def test_create_info_and_kill_a_two_host_job_through_torchx(tools_workdir):
    from torchx import specs

    from monarch.tools.commands import create, info, kill_and_confirm, server_ready
    from monarch.tools.config import Config
    from monarch.tools.config.workspace import Workspace
    from monarch.tools.mesh_spec import MeshSpec, tag_as_metadata

    src = tools_workdir / "proj"
    src.mkdir()
    (src / "hello.txt").write_text("hi\n")
    app = specs.AppDef("unused", roles=[specs.Role("trainer", image=str(tools_workdir), entrypoint="sleep",
                                                   args=["300"], num_replicas=2)])
    tag_as_metadata(MeshSpec("trainer", 2, host_type="cpu", gpus=0), app)
    config = Config(scheduler="slurm", appdef=app, workspace=Workspace(dirs=[src], env=None), dryrun=True)
    dry = create(config, name="toolstest")
    assert str(dry).startswith("sbatch") and "--job-name=trainer-0" in str(dry)  # the request, not submitted

    config.dryrun = False
    handle = create(config, name="toolstest")
    assert isinstance(handle, str) and handle.startswith("slurm://monarch/")
    job_id = handle.rsplit("/", 1)[1]
    try:
        spec = asyncio.run(server_ready(handle, timedelta(seconds=0.2)))
        assert spec is not None and spec.is_running, spec
        assert (spec.scheduler, spec.namespace, spec.get_mesh_names()) == ("slurm", "monarch", ["trainer"])
        mesh = spec.get_mesh_spec("trainer")
        assert mesh.num_hosts == 2 and len(mesh.hostnames) == 2 and all(mesh.hostnames), mesh
        assert spec.host0("trainer") == mesh.hostnames[0]
        assert squeue_state(job_id).split() == ["RUNNING", "RUNNING"]  # one job component per host
    finally:
        kill_and_confirm("slurm:///" + job_id, timeout_after_kill=60)  # Monarch's form of a handle is read too
    assert squeue_state(job_id) == ""
    after = info(handle)
    assert after is None or not after.is_running
    assert info("slurm:///999999") is None
