"""Mount a local folder read-only on every host of a mesh, as PyTorch Monarch's ``monarch.remotemount``.

    from monarch.remotemount import remotemount

    handle = remotemount(host_mesh, "/home/me/project", "/tmp/project/$SUBDIR")
    handle.open()        # mounted (FUSE) on each host; the small files are there, big ones come when read
    ...                  # edit files here
    handle.refresh()     # each host shows the folder as it is now, in one step (open files too)
    handle.close()       # unmounted everywhere, the workers stopped

``$SUBDIR`` in ``mntpoint`` becomes each host's mesh coordinates (``hosts_0``, ``hosts_1``, ...),
so several hosts of one machine do not mount on the same place.  How it works, and Monarch's
building blocks (``build_index``, ``materialise_block``, ``FUSEActor``, ...):
:mod:`monarch.remotemount.remotemount`.

What it does not do: let the hosts write to the mount (it is read-only), or mount over the source
folder on the machine that holds it (``ValueError``: the mount would hide, and read through
itself, the files it is made of).
"""

from monarch.remotemount.remotemount import MountHandler, point_key, remotemount

__all__ = ["MountHandler", "point_key", "remotemount"]
