"""Compatibility only: Monarch's ``monarch._src.actor.host_mesh`` names, aliases of ``monarch.actor``'s,
and ``_spawn_admin``: the mesh admin HTTP API over some host meshes (what ``JobTrait.enable_admin()``
serves for a job), for a program that holds meshes without a job."""

from __future__ import annotations

import os
from typing import Any

from monarch.actor import HostMesh, default_bootstrap_cmd, hosts_from_config, this_host, this_proc  # noqa: F401
from monarch_agents.future import Future

# The admin servers this process started: they serve until it exits, as Monarch's admin agent does.
_servers: list[Any] = []


class _AdminRef:
    """What ``_spawn_admin`` returns beside the URL (Monarch's is an opaque capability token)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:
        return f"MeshAdminRef({self.url})"


def _spawn_admin(host_meshes: list[HostMesh], admin_addr: str | None = None,
                 telemetry_url: str | None = None) -> Future:
    """Serve the mesh admin API (``/v1/root``, hosts, procs, actors) over ``host_meshes`` at
    ``admin_addr`` ("HOST:PORT"; default: ``monarch.config``'s ``mesh_admin_addr``); a Future of
    ``(admin_url, ref)``.  ``telemetry_url`` is accepted for Monarch compatibility (unused)."""
    if not host_meshes:
        raise ValueError("_spawn_admin requires at least one HostMesh")

    async def start() -> tuple[str, _AdminRef]:
        from monarch import config
        from monarch._workbench import job_services as js
        from monarch.actor._client import shared_agent_addr

        bind, port = js.parse_bind(admin_addr or config.get_global_config()["mesh_admin_addr"])
        hosts = js.hosts_of(dict(enumerate(host_meshes)))
        hosts.shared_addr = shared_agent_addr()
        server = js.JobServer(hosts, telemetry=False, admin=True,
                              bind=bind, port=port)
        _servers.append(server)
        os.environ["MONARCH_ADMIN_URL"] = server.url  # where Monarch's tools look for it
        server.announce_admin()  # on stdout, as Monarch's
        return server.url, _AdminRef(server.url)

    return Future._from_coro(start())
