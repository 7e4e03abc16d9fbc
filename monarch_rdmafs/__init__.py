"""Workspace sync (installed as ``monarch_rdmafs``): pack -> transfer -> read-only mount on every host.

``pack.py`` turns a folder into a manifest (``manifest.py``) and content-addressed chunks;
``store.py`` is a host's chunk store; ``fs.py`` the read-only FUSE filesystem over it, run by
the mount process in ``mount.py`` (or materialized where FUSE cannot be used); ``service.py``
is the host agent's workspace service (receive, forward down the fan-out tree, commit);
``messages.py`` its protocol; ``rdma.py`` the one place that picks RDMA or TCP;
``gather_fs.py`` the filesystem of ``monarch.gather_mount``.

Importing this package is cheap: each name loads its module on first use (``rdma.py`` is read
by Pythons that have no xxhash).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "Packer": "pack", "PackResult": "pack", "ChunkSource": "pack",
    "Manifest": "manifest", "Entry": "manifest", "CHUNK_SIZE": "manifest", "chunk_id": "manifest",
    "ChunkStore": "store",
    "WorkspaceService": "service",
    "FuseMount": "mount", "MaterializedMount": "mount", "fuse_unavailable_reason": "mount",
    "unmount_stale": "mount",
    "TransportChoice": "rdma", "choose_transport": "rdma",
    "SyncError": "errors", "WorkspaceUnreadable": "errors", "SourceChanged": "errors", "CorruptChunk": "errors",
    "StoreFull": "errors",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch_rdmafs' has no attribute {name!r}")
    return getattr(import_module(f"monarch_rdmafs.{module}"), name)
