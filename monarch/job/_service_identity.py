"""Service proc identities, as Monarch's launchers hand them to workers.

Each worker's host service has a unique ``ProcId`` (``service<v>``); launchers that start many
workers with one environment pass them all as a JSON list (``MONARCH_SERVICE_PROC_IDS``) and each
worker picks its own by rank (``MONARCH_SERVICE_PROC_RANK``).  A worker address may carry its
identity, ``service<v>@tcp://host:port``, which ``run_worker_loop_forever`` and
``attach_to_workers`` accept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from monarch.actor._ids import ProcId, Uid

SERVICE_PROC_IDS_ENV = "MONARCH_SERVICE_PROC_IDS"
SERVICE_PROC_RANK_ENV = "MONARCH_SERVICE_PROC_RANK"


def new_service_proc_id() -> ProcId:
    """A fresh identity for a worker's host service."""
    return ProcId(Uid.instance("service"))


def allocate_service_proc_ids(count: int) -> list[ProcId]:
    """``count`` distinct identities for a ranked group of workers (consecutive values)."""
    base = int.from_bytes(os.urandom(8), "little")
    return [ProcId(Uid.instance_from_value((base + i) % (1 << 64), "service")) for i in range(count)]


def serialize_service_proc_ids(proc_ids: Sequence[ProcId]) -> str:
    return json.dumps([str(p) for p in proc_ids])


def deserialize_service_proc_ids(serialized: str) -> list[ProcId]:
    return [ProcId.from_string(p) for p in json.loads(serialized)]


def service_proc_addr(address: str, proc_id: ProcId | None) -> str:
    """``proc_id@address`` (``address`` itself without an identity)."""
    return address if proc_id is None else f"{proc_id}@{address}"


def service_proc_addrs(addresses: Sequence[str], proc_ids: Sequence[ProcId] | None) -> list[str]:
    if proc_ids is None:
        return list(addresses)
    if len(addresses) != len(proc_ids):
        raise ValueError(f"got {len(addresses)} worker addresses and {len(proc_ids)} service ProcIds")
    return [service_proc_addr(a, p) for a, p in zip(addresses, proc_ids)]


def ranked_service_proc_id_from_env(*, rank_env: str = SERVICE_PROC_RANK_ENV) -> ProcId | None:
    """This worker's identity from a ranked launcher's environment (None where it sets none)."""
    serialized = os.environ.get(SERVICE_PROC_IDS_ENV)
    rank = os.environ.get(rank_env)
    if serialized is None or rank is None:
        return None
    return deserialize_service_proc_ids(serialized)[int(rank)]
