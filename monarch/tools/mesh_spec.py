"""PyTorch Monarch's ``monarch.tools.mesh_spec``: a mesh of a TorchX job (``MeshSpec``: one role's
hosts) and the job as ``monarch.tools.commands.info`` describes it (``ServerSpec``).

A mesh's host type, GPU count and transport travel in the ``AppDef``'s metadata under
``monarch/meshes/<mesh>/...`` (``tag_as_metadata``), so that ``info`` can rebuild the
``MeshSpec`` from what the scheduler describes (``mesh_spec_from_metadata``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from monarch.tools.network import get_sockaddr
from torchx import specs
from torchx.specs.api import is_terminal

__all__ = ["DEFAULT_REMOTE_ALLOCATOR_PORT", "MeshSpec", "ServerSpec", "mesh_spec_from_metadata",
           "mesh_spec_from_str", "tag_as_metadata"]

#: The port a mesh's hosts serve on unless the role's port map names "mesh".
DEFAULT_REMOTE_ALLOCATOR_PORT = 26600

_UNSET_INT = -1
_UNSET_STR = "__UNSET__"
_TRANSPORTS = ("tcp", "metatls")


def _meta_key(mesh_name: str, what: str) -> str:
    return f"monarch/meshes/{mesh_name}/{what}"


@dataclass
class MeshSpec:
    """One mesh (a role) of a job: what to ask the scheduler for, and what ``info`` found."""

    name: str
    num_hosts: int
    host_type: str = _UNSET_STR
    gpus: int = _UNSET_INT
    transport: str = "tcp"
    port: int = DEFAULT_REMOTE_ALLOCATOR_PORT
    hostnames: list[str] = field(default_factory=list)
    state: specs.AppState = specs.AppState.UNSUBMITTED
    image: str = _UNSET_STR

    def server_addrs(self, transport: Optional[str] = None, port: Optional[int] = None) -> list[str]:
        """Each host as a channel address, ``tcp!IP:PORT`` (names resolved) or ``metatls!HOST:PORT``;
        ``transport`` and ``port`` override the mesh's."""
        transport = transport or self.transport
        port = port or self.port
        if transport not in _TRANSPORTS:
            raise ValueError(f"Unsupported transport: {transport}. Must be one of: 'tcp' or 'metatls'")
        if transport == "tcp":
            return [f"tcp!{get_sockaddr(h, port)}" for h in self.hostnames]
        return [f"metatls!{h}:{port}" for h in self.hostnames]


def tag_as_metadata(mesh_spec: MeshSpec, appdef: specs.AppDef) -> None:
    """Record the mesh's host type, GPUs and transport in ``appdef.metadata``."""
    appdef.metadata[_meta_key(mesh_spec.name, "host_type")] = mesh_spec.host_type
    appdef.metadata[_meta_key(mesh_spec.name, "gpus")] = str(mesh_spec.gpus)
    appdef.metadata[_meta_key(mesh_spec.name, "transport")] = mesh_spec.transport


def mesh_spec_from_metadata(appdef: specs.AppDef, mesh_name: str) -> Optional[MeshSpec]:
    """The ``MeshSpec`` of the role ``mesh_name`` of ``appdef`` (None if it has no such role)."""
    role = next((r for r in appdef.roles if r.name == mesh_name), None)
    if role is None:
        return None
    meta = appdef.metadata
    return MeshSpec(name=mesh_name, num_hosts=role.num_replicas, image=role.image,
                    host_type=meta.get(_meta_key(mesh_name, "host_type"), _UNSET_STR),
                    gpus=int(meta.get(_meta_key(mesh_name, "gpus"), str(_UNSET_INT))),
                    transport=meta.get(_meta_key(mesh_name, "transport"), "tcp"),
                    port=role.port_map.get("mesh", DEFAULT_REMOTE_ALLOCATOR_PORT))


def mesh_spec_from_str(mesh_spec_str: str) -> MeshSpec:
    """``NAME:NUM_HOSTS:HOST_TYPE`` (e.g. ``trainer:8:gpu.medium``) as a ``MeshSpec``; the GPUs are
    those of TorchX's named resource ``HOST_TYPE``."""
    parts = mesh_spec_str.split(":")
    assert len(parts) == 3, f"`{mesh_spec_str}` is not of the form 'NAME:NUM_HOSTS:HOST_TYPE'"
    name, num_hosts, host_type = parts
    assert num_hosts.isdigit(), f"`{num_hosts}` is not a number in: {mesh_spec_str}"
    return MeshSpec(name, int(num_hosts), host_type, specs.resource(h=host_type).gpu)


@dataclass
class ServerSpec:
    """A job as its scheduler describes it (``monarch.tools.commands.info``): its state and meshes."""

    name: str
    state: specs.AppState
    meshes: list[MeshSpec]
    scheduler: str
    namespace: str = ""
    ui_url: Optional[str] = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def server_handle(self) -> str:
        """``scheduler://namespace/name``, what ``info``/``kill`` take."""
        return f"{self.scheduler}://{self.namespace}/{self.name}"

    @property
    def is_running(self) -> bool:
        return self.state == specs.AppState.RUNNING

    def host0(self, mesh_name: str) -> str:
        """The first host of mesh ``mesh_name`` (e.g. torch.distributed's ``MASTER_ADDR``); the job
        must be RUNNING (hostnames are known only then)."""
        mesh = self.get_mesh_spec(mesh_name)
        if self.is_running:
            if not mesh.hostnames:
                raise RuntimeError(f"{self.server_handle} does not have any hosts")
            return mesh.hostnames[0]
        if self.state in (specs.AppState.SUBMITTED, specs.AppState.PENDING):
            raise RuntimeError(f"{self.server_handle} is {self.state}. Use `monarch.tools.commands.server_ready()` "
                               f"to wait for the server to be {specs.AppState.RUNNING}")
        if is_terminal(self.state):
            raise RuntimeError(f"{self.server_handle} is {self.state}. "
                               "Use `monarch.tools.commands.get_or_create()` to create a new server")
        raise RuntimeError(f"{self.server_handle} is in an invalid state: {self.state}. Please report this as a bug")

    def get_mesh_spec(self, mesh_name: str) -> MeshSpec:
        for mesh in self.meshes:
            if mesh.name == mesh_name:
                return mesh
        raise ValueError(f"Mesh: '{mesh_name}' not found in job: {self.name}. Try one of: {self.get_mesh_names()}")

    def get_mesh_names(self) -> list[str]:
        return [m.name for m in self.meshes]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary: name, handle, UI URL (if any), state and each mesh's hosts."""
        doc: dict[str, Any] = {"name": self.name, "server_handle": self.server_handle}
        if self.ui_url:
            doc["ui_url"] = self.ui_url
        doc["state"] = self.state.name
        doc["meshes"] = {m.name: {"host_type": m.host_type, "hosts": m.num_hosts, "gpus": m.gpus,
                                  "hostnames": m.hostnames} for m in self.meshes}
        return doc
