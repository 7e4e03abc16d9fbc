"""PyTorch Monarch's ``monarch.tools.config`` (``Config``, ``Workspace``, ``defaults``) and
``monarch.tools.mesh_spec``: what ``monarch.tools.commands.create`` submits through TorchX and
how ``info`` describes a job."""

from __future__ import annotations

import json
import warnings

import pytest
from torchx import specs

from monarch.tools.config import Config, defaults
from monarch.tools.config.environment import CondaEnvironment
from monarch.tools.config.workspace import Workspace
from monarch.tools.mesh_spec import MeshSpec, ServerSpec, mesh_spec_from_metadata, mesh_spec_from_str, tag_as_metadata


def test_workspace_folders_merge_and_tell_each_role_where_they_are(tmp_path):
    for rel in ("a/x.py", "b/pkg/y.py", "c/top.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    ws = Workspace(dirs={tmp_path / "a": "code/a", tmp_path / "b": "b", tmp_path / "c": ""}, env=None)
    ws.merge(tmp_path / "out")
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file()) == \
        ["b/pkg/y.py", "code/a/x.py", "top.txt"]
    assert Workspace(dirs=[tmp_path / "a", str(tmp_path / "b")]).dirs == {tmp_path / "a": "a", tmp_path / "b": "b"}
    with pytest.raises(AssertionError):
        Workspace(dirs=[""])

    app = specs.AppDef("t", roles=[specs.Role("r0", "img"), specs.Role("r1", "img", env={"PYTHONPATH": "/mine",
                                                                                        "WORKSPACE_DIR": "/ws"})])
    ws.set_env_vars(app)
    ws.set_env_vars(app)  # twice: nothing added again
    root = f"{specs.macros.img_root}/workspace"
    assert app.roles[0].env == {"WORKSPACE_DIR": root, "PYTHONPATH": f"{root}/code/a:{root}/b:{root}/"}
    assert app.roles[1].env == {"WORKSPACE_DIR": "/ws", "PYTHONPATH": "/mine:/ws/code/a:/ws/b:/ws/"}
    conda = specs.AppDef("t", roles=[specs.Role("r", "img")])
    Workspace(env=CondaEnvironment("/envs/x")).set_env_vars(conda)
    assert conda.roles[0].env["CONDA_DIR"] == f"{specs.macros.img_root}/conda"
    assert Workspace.null() == Workspace(env=None) != Workspace()


def test_config_defaults_and_the_old_workspace_forms():
    c = Config()
    assert (c.scheduler, c.scheduler_args, c.workspace, c.dryrun, c.appdef.name) == \
        ("__NOT_SET__", {}, Workspace.null(), False, "__NOT_SET__")
    with pytest.warns(FutureWarning):
        assert Config(workspace="/src/proj").workspace.dirs == {__import__("pathlib").Path("/src/proj"): ""}
    with pytest.warns(FutureWarning):
        assert Config(workspace=None).workspace == Workspace.null()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Config(workspace=Workspace(env=None))
    assert {"local_cwd", "slurm", "k8s", "local_docker"} <= set(defaults.scheduler_factories())
    with pytest.raises(NotImplementedError, match="no default component_fn"):
        defaults.component_fn("slurm")


def test_mesh_specs_travel_in_the_appdefs_metadata():
    app = specs.AppDef("job", roles=[specs.Role("trainer", "img", num_replicas=3, port_map={"mesh": 29001})])
    tag_as_metadata(MeshSpec("trainer", 3, host_type="gpu.small", gpus=1, transport="metatls"), app)
    back = mesh_spec_from_metadata(app, "trainer")
    assert (back.num_hosts, back.host_type, back.gpus, back.transport, back.port, back.image) == \
        (3, "gpu.small", 1, "metatls", 29001, "img")
    assert mesh_spec_from_metadata(app, "other") is None
    assert mesh_spec_from_str("gen:2:gpu.small").gpus == 1
    for bad in ("gen:2", "gen:two:gpu.small"):
        with pytest.raises(AssertionError):
            mesh_spec_from_str(bad)
    assert MeshSpec("m", 1, hostnames=["h0"], transport="metatls").server_addrs(port=7) == ["metatls!h0:7"]
    assert MeshSpec("m", 1, hostnames=["127.0.0.1"]).server_addrs() == ["tcp!127.0.0.1:26600"]
    with pytest.raises(ValueError, match="Unsupported transport"):
        MeshSpec("m", 1, transport="ipc").server_addrs()


def test_server_spec_names_its_first_host_only_while_running():
    mesh = MeshSpec("trainer", 2, hostnames=["n0", "n1"])
    running = ServerSpec("job", specs.AppState.RUNNING, [mesh], "slurm", namespace="ns", ui_url="http://ui")
    assert (running.server_handle, running.is_running, running.host0("trainer")) == ("slurm://ns/job", True, "n0")
    assert json.loads(json.dumps(running.to_json()))["meshes"]["trainer"]["hostnames"] == ["n0", "n1"]
    for state, words in ((specs.AppState.PENDING, "server_ready"), (specs.AppState.CANCELLED, "get_or_create"),
                         (specs.AppState.UNKNOWN, "report this as a bug")):
        with pytest.raises(RuntimeError, match=words):
            ServerSpec("job", state, [mesh], "slurm").host0("trainer")
    with pytest.raises(ValueError, match=r"Try one of: \['trainer'\]"):
        running.get_mesh_spec("nope")
