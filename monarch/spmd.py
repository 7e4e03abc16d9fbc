"""monarch.spmd: run torchrun-style (SPMD) programs on a proc mesh, as PyTorch Monarch's ``monarch.spmd``.

    from monarch.actor import this_host
    from monarch.spmd import SPMDActor, setup_torch_elastic_env

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    setup_torch_elastic_env(procs)          # RANK, WORLD_SIZE, MASTER_ADDR, ... in every proc
    # or run a whole training script on every proc, as torchrun would:
    actors = procs.spawn("_SPMDActor", SPMDActor)
    addr, port = actors.slice(**dict.fromkeys(procs._labels, 0)).get_host_port.call_one(None).get()
    actors.main.call(addr, port, ["train.py", "--lr", "0.1"]).get()

The last dimension of the mesh is the one within a host (``LOCAL_RANK``); the rank is the flat
rank over the whole mesh, as torchrun numbers them.
"""

from __future__ import annotations

import enum
import math
import os
import runpy
import socket
import sys
from typing import Any

from monarch.actor import Actor, ProcMesh, current_rank, current_size, endpoint


class AddrType(enum.Enum):
    """Which address ``get_host_port`` gives for the master: the host name (None), or an IP of a family."""

    Default = enum.auto()  # IPv6 where the host has one, else IPv4
    IPv4 = enum.auto()
    IPv6 = enum.auto()


def _ipaddr(hostname: str, port: int, addr_type: Any) -> str:
    kind = getattr(addr_type, "name", str(addr_type))
    families = {"IPv4": [socket.AF_INET], "IPv6": [socket.AF_INET6]}.get(kind, [socket.AF_INET6, socket.AF_INET])
    for family in families:
        try:
            infos = socket.getaddrinfo(hostname, port, family=family, type=socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        if infos:
            return str(infos[0][4][0])
    raise RuntimeError(f"cannot resolve {hostname!r} to an {kind} address; check the host's network configuration")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SPMDActor(Actor):
    """Sets torch elastic's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...)
    in its proc from its place in the mesh, and runs a training script there as torchrun would."""

    def __init__(self) -> None:
        point = current_rank()
        sizes = current_size()
        labels = list(point.extent.labels)
        local_dim = labels[-1] if labels else None
        self.rank: int = point.rank
        self.local_rank: int = point[local_dim] if local_dim else 0
        self.local_world_size: int = sizes[local_dim] if local_dim else 1
        self.nproc_per_node: int = self.local_world_size
        self.world_size: int = math.prod(sizes.values()) if sizes else 1
        self.group_rank: int = self.rank // self.local_world_size
        self.group_world_size: int = (self.world_size + self.local_world_size - 1) // self.local_world_size

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        os.environ.update({
            "MASTER_ADDR": str(master_addr),
            "MASTER_PORT": str(master_port),
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "GROUP_WORLD_SIZE": str(self.group_world_size),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": "rank",
            "WORLD_SIZE": str(self.world_size),
        })

    @endpoint
    def get_host_port(self, use_ipaddr: Any = None) -> tuple[str, int]:
        """This host's name (or an address of ``use_ipaddr``'s kind) and a free port, for the master."""
        hostname = socket.gethostname()
        port = _free_port()
        if use_ipaddr is None:
            return hostname, port
        return _ipaddr(hostname, port, use_ipaddr), port

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set the torch elastic environment variables in this proc."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set the environment, then run ``script_args`` (a script path, or ``["-m", module]``, then its
        arguments) as ``__main__`` in this proc.  Returns True when it finished."""
        self._setup_env(master_addr, master_port)
        if script_args and script_args[0] == "-m":
            if len(script_args) < 2:
                raise ValueError("No module specified after -m")
            sys.argv = [script_args[1], *script_args[2:]]
            runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
        elif script_args:
            sys.argv = list(script_args)
            runpy.run_path(script_args[0], run_name="__main__")
        else:
            raise ValueError("No script or module specified")
        return True


def _check_master(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise ValueError("Either both master_addr and master_port must be specified or neither must be specified.")


def setup_torch_elastic_env(proc_mesh: ProcMesh, master_addr: str | None = None, master_port: int | None = None,
                            use_ipaddr: Any = None) -> None:
    """Set torch elastic's environment variables in every proc of ``proc_mesh``.

    Without ``master_addr``/``master_port``, the first proc's host and a free port there are the master.
    """
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    if master_addr is None:
        first = dict.fromkeys(proc_mesh._labels, 0)
        master_addr, master_port = actors.slice(**first).get_host_port.call_one(use_ipaddr).get()
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(proc_mesh: ProcMesh, master_addr: str | None = None,
                                        master_port: int | None = None, use_ipaddr: Any = None) -> None:
    """:func:`setup_torch_elastic_env` for ``async`` code."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    if master_addr is None:
        first = dict.fromkeys(proc_mesh._labels, 0)
        master_addr, master_port = await actors.slice(**first).get_host_port.call_one(use_ipaddr)
    await actors.setup_env.call(master_addr, master_port)


__all__ = ["AddrType", "SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
