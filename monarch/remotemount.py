"""Mount a local folder read-only on every host of a mesh, as in PyTorch Monarch's ``monarch.remotemount``.

    from monarch.remotemount import remotemount

    handle = remotemount(host_mesh, "/home/me/project", "/tmp/project/$SUBDIR")
    handle.open()        # packed, sent once down a fan-out tree of hosts, mounted (FUSE) on each
    ...                  # edit files here
    handle.refresh()     # only what changed travels; each host switches in one step
    handle.close()       # unmounted everywhere

``$SUBDIR`` in ``mntpoint`` becomes each host's mesh coordinates (``hosts_0``,
``hosts_1``, ...), so several hosts of one machine do not mount on the same
place.  Unlike Monarch, the whole tree is sent at ``open`` (content-addressed
chunks: what a host already has is never sent again) rather than faulted in on
first read.

What it does not do: let the hosts write to the mount (it is read-only), or
mount over the source folder on the machine that holds it.
"""

from __future__ import annotations

import os
from typing import Any, Optional

__all__ = ["MountHandler", "remotemount"]


def point_key(mesh: Any, index: int) -> str:
    """The mesh coordinates of the ``index``-th host as Monarch names them (``hosts_0``; '' for one host)."""
    shape = mesh._shape
    return "_".join(f"{k}_{v}" for k, v in shape.point(index).items()) if shape.labels else ""


class MountHandler:
    """The owner's handle on one folder mounted on every host of a mesh: ``open``, ``refresh``, ``close``."""

    def __init__(self, host_mesh: Any, sourcepath: str, mntpoint: Optional[str] = None):
        self.host_mesh = host_mesh
        self.sourcepath = sourcepath
        self.mntpoint = mntpoint
        self._pusher: Any = None

    def open(self, via_gateway: bool = False) -> None:
        """Send the folder to every host and mount it there; returns once every host serves it.

        ``via_gateway`` is accepted for Monarch compatibility and has no effect here.
        """
        from monarch._workbench.workspace import Target, WorkspacePusher, check_source
        from monarch_agents.transport import is_same_host

        source = check_source(self.sourcepath, "sourcepath")
        mnt = os.path.abspath(self.mntpoint) if self.mntpoint else source
        targets = []
        for i, h in enumerate(self.host_mesh.hosts):
            where = os.path.abspath(mnt.replace("$SUBDIR", point_key(self.host_mesh, i)))
            if is_same_host(h.addr) and (where == source or source.startswith(where + os.sep)):
                raise ValueError(f"mntpoint {where} would hide the source folder on this machine (host {h.host}); "
                                 "give a mntpoint elsewhere, e.g. '/tmp/mnt/$SUBDIR'")
            targets.append(Target(h.addr, h.host, h.host_rank, where))
        name = "remote:" + mnt
        self._pusher = WorkspacePusher(self.host_mesh._rt(), source, targets, name=name)
        self._pusher.sync(force=True)

    def refresh(self, sourcepath: Optional[str] = None) -> None:
        """Send what changed since the last ``open``/``refresh``; each host switches to it in one step.

        ``sourcepath`` is accepted for Monarch compatibility; the folder is the one given at creation.
        """
        if self._pusher is None:
            raise RuntimeError("no active mount to refresh; call open() first")
        self._pusher.sync()

    def close(self) -> None:
        """Unmount on every host (safe to call twice)."""
        if self._pusher is not None:
            pusher, self._pusher = self._pusher, None
            pusher.close()


def remotemount(host_mesh: Any, sourcepath: str, mntpoint: Optional[str] = None) -> MountHandler:
    """Mount the local folder ``sourcepath`` read-only at ``mntpoint`` (default: the same path) on every host.

    Nothing happens until ``open()``.
    """
    return MountHandler(host_mesh, sourcepath, mntpoint)
