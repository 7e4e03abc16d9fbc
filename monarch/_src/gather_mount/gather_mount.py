"""Compatibility only: Monarch's ``monarch._src.gather_mount.gather_mount``: ``gather_mount`` and
``GatherMount`` are ``monarch.gather_mount``'s.

``_NOTIFY_BATCH_S``: Monarch's tests wait a few times this after changing a file on a host before
reading it through the mount.  Monarch batches its hosts' change notices over that window; monarch
sends none: a file's attributes and bytes are asked of its host at each stat and open
(``monarch_rdmafs.gather_fs``), so a change shows at once, well within it.
"""

from monarch.gather_mount import GatherMount, gather_mount

__all__ = ["GatherMount", "gather_mount"]

#: Seconds within which a change on a host shows in the mount (Monarch's value; ours: at once).
_NOTIFY_BATCH_S: float = 0.05
