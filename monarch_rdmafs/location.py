"""Where a host keeps the workspace store and mounts of a host agent, and how a dead agent's are removed.

Here, not in the host agent's workspace service, so that whoever releases a host (the local
scheduler's ``stop``) can remove what an agent killed with -9 left, without importing the agent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

from monarch_rdmafs.mount import unmount_stale


def workspace_root(log_dir: str) -> str:
    """Where this host keeps the workspace store and mounts of the agent logging to ``log_dir``."""
    env = os.environ.get("MONARCH_WORKSPACE_DIR")
    if env:
        return os.path.abspath(env)
    return default_workspace_root(log_dir)


def default_workspace_root(log_dir: str) -> str:
    """The workspace folder of the agent logging to ``log_dir`` when ``MONARCH_WORKSPACE_DIR`` is not set."""
    tag = hashlib.sha256(os.path.abspath(log_dir).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"monarch-{os.getuid()}", f"ws-{tag}")


def remove_workspace(log_dir: str) -> None:
    """Unmount and remove what the (stopped or killed) agent logging to ``log_dir`` kept on this machine.

    Only the default location: a ``MONARCH_WORKSPACE_DIR`` the user chose is theirs to remove.
    """
    root = default_workspace_root(log_dir)
    if os.path.isdir(root):
        unmount_stale(os.path.join(root, "store"))
        shutil.rmtree(root, ignore_errors=True)
