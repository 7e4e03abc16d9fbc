"""Where a host keeps the workspace store and mounts of a host agent, and how a dead agent's are removed.

Here, not in the host agent's workspace service, so that whoever releases a host (the local
scheduler's ``stop``) can remove what an agent killed with -9 left, without importing the agent.
"""

from __future__ import annotations

import hashlib
import os
import shutil

from monarch_rdmafs.mount import unmount_stale
from monarch_rdmafs.private import runtime_dir


def workspace_root(log_dir: str) -> str:
    """Where this host keeps the workspace store and mounts of the agent logging to ``log_dir``."""
    env = os.environ.get("MONARCH_WORKSPACE_DIR")
    if env:
        return os.path.abspath(env)
    return default_workspace_root(log_dir)


def default_workspace_root(log_dir: str) -> str:
    """The workspace folder of the agent logging to ``log_dir`` when ``MONARCH_WORKSPACE_DIR`` is not set."""
    tag = hashlib.sha256(os.path.abspath(log_dir).encode()).hexdigest()[:12]
    # In this user's private runtime folder (XDG_RUNTIME_DIR, else the temp dir's monarch-<uid>),
    # which the workspace service makes or checks before it stores a chunk (monarch_rdmafs.private).
    return os.path.join(runtime_dir(make=False), f"ws-{tag}")


def remove_workspace(log_dir: str) -> None:
    """Unmount and remove what the (stopped or killed) agent logging to ``log_dir`` kept on this machine.

    Only the default location: a ``MONARCH_WORKSPACE_DIR`` the user chose is theirs to remove.
    """
    root = default_workspace_root(log_dir)
    if os.path.isdir(root) and not os.path.islink(root) and os.stat(root).st_uid == os.getuid():
        unmount_stale(os.path.join(root, "store"))
        shutil.rmtree(root, ignore_errors=True)
