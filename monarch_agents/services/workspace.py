"""The workspace service: synced trees served read-only on this host (``monarch_rdmafs``), plugged into the agent.

Its store and mounts live under ``$MONARCH_WORKSPACE_DIR``, else a folder of
this host's temp dir named after the agent's log folder (node-local disk, one per
job and host, found again by the next agent of the same host, which unmounts
what a killed one left).  Commands and procs the agent starts go through
:meth:`WorkspaceAgentService.place`, so they start in the mount with it on
``PYTHONPATH``.  A clean stop unmounts and removes the store; the store of an
agent killed with -9 is removed by whoever released its host on this machine
(:func:`monarch_rdmafs.location.remove_workspace`, called by the local scheduler's ``stop``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from typing import Any, Callable

from monarch_agents.services import Child, Service, killpg
# Where a host keeps its workspace is rdmafs's to say: the local scheduler removes a killed
# agent's store through it too, without importing this service.
from monarch_rdmafs.location import default_workspace_root, remove_workspace, workspace_root  # noqa: F401
from monarch_rdmafs.service import WorkspaceService


class WorkspaceAgentService(Service):
    """Receives chunks (forwarding them down the fan-out tree on the IO thread), mounts, and places children."""

    name = "workspace"
    # Batches are forwarded the moment they arrive; the rdmafs service stores them on its own thread.
    blocking = False

    def __init__(self, agent: Any):
        super().__init__(agent)
        root = workspace_root(agent.log_dir)
        # The default root is in this user's runtime folder, which must be private too (another user
        # could have made /tmp/monarch-<uid> first); a MONARCH_WORKSPACE_DIR's parent is the user's.
        top = None if os.environ.get("MONARCH_WORKSPACE_DIR") else os.path.dirname(root)
        # Mount processes are forks of the agent's zygote (FUSE imported once by the local launcher):
        # 256 hosts' first sync started 256 interpreters, ~30 MiB and 0.12 CPU-s each.
        spawn = self._spawn if hasattr(agent, "start_child") else None
        self.ws = WorkspaceService(root, host=agent.host, host_rank=agent.host_rank, send=agent.send,
                                   reply=agent.reply, addr=lambda: agent.rt.addr, private_top=top, spawn=spawn)

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return self.ws.handlers()

    def info(self) -> dict:
        return self.ws.status()

    def place(self, cwd: str | None, env: dict) -> tuple[str | None, dict]:
        """A child's working directory and environment, moved into the synced workspace if there is one."""
        cwd, env = self.ws.place(cwd, env)
        ws = self.ws.mounts.get("workspace")
        if ws is not None and env.get("MONARCH_SYS_PATH"):
            # The spawner's sys.path entries inside its workspace are in the mount here.
            env["MONARCH_SYS_PATH"] = os.pathsep.join(
                self.ws.place(p, {})[0] or p for p in env["MONARCH_SYS_PATH"].split(os.pathsep))
        return cwd, env

    def stop(self, deadline: float) -> None:
        self.ws.stop(deadline)
        shutil.rmtree(self.ws.root, ignore_errors=True)

    def _spawn(self, argv: list[str], stdin: int, stdout: int, stderr: int) -> "_Helper":
        """``monarch_rdmafs.helper.Spawn``: ``[python, "-m", module, *args]`` as a fork of the zygote."""
        if len(argv) < 3 or argv[1] != "-m":
            raise ValueError(f"not a module to run: {argv}")
        child = _Helper()
        self.agent.start_child({"kind": "call", "module": argv[2], "argv": argv[3:]}, [stdin, stdout, stderr], child)
        if not child.started.wait(_HELPER_START_S):
            child.kill()
            raise OSError(f"the zygote did not start {argv[2]} within {_HELPER_START_S:g} s")
        if child.error:
            raise OSError(f"the zygote could not start {argv[2]}: {child.error}")
        return child


#: How long the zygote gets to fork a helper (milliseconds when it is well).
_HELPER_START_S = 30.0


class _Helper(Child):
    """A helper process forked by the zygote, as ``monarch_rdmafs.helper`` sees one (``SpawnedChild``)."""

    def __init__(self) -> None:
        super().__init__("helper", "")
        self.started = threading.Event()
        self.error = ""
        self._done = threading.Event()
        self._code: int | None = None

    def on_started(self, pid: int) -> None:
        self.started.set()

    def on_failed(self, error: str) -> None:
        self.error = error
        self._code = 1
        self._done.set()
        self.started.set()

    def on_exited(self, code: int | None, reason: str) -> None:
        self._code = code if code is not None else 1
        self._done.set()

    def poll(self) -> int | None:
        return self._code if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"helper {self.pid}", timeout or 0.0)
        return self._code if self._code is not None else 1

    def kill(self) -> None:
        if self.pid and not self._done.is_set():
            killpg(self.pid, signal.SIGKILL)
