"""Every host's folder visible here, read-only, one sub-folder per host, as in PyTorch Monarch's ``gather_mount``.

    from monarch.gather_mount import gather_mount

    with gather_mount(host_mesh, "/tmp/run/$SUBDIR/logs", "/tmp/all_logs") as m:
        print(os.listdir("/tmp/all_logs"))          # ['hosts_0', 'hosts_1', ...]

The mount is live on return.  ``$SUBDIR`` in the remote path becomes each
host's mesh coordinates (``hosts_0``); a one-host mesh with no dimensions is
mounted at the root, with no sub-folder.  Reads go to the host's agent over the
job's authenticated connection; a small process here serves the FUSE mount and
unmounts when closed, when its owner exits or dies.

What it does not do: writes.  It has no change notices to wait for either: a
file's attributes are asked of its host at each stat and open and its bytes read
fresh at each open, so what a host appends or replaces shows at once (a folder's
attributes and names may be a second old).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from monarch_rdmafs.helper import HelperProcess

__all__ = ["GatherMount", "gather_mount"]

_READY_TIMEOUT_S = 30.0
_CALL_TIMEOUT_S = 30.0
#: How long the mount process may take to unmount and end when its stdin closes.
_STOP_TIMEOUT_S = 10.0


class GatherMount:
    """A live gather mount; ``close()`` (or leaving the ``with`` block) unmounts it."""

    def __init__(self, host_mesh: Any, remote_mount_point: str, local_mount_point: str):
        from monarch.remotemount import point_key
        from monarch_agents.client import current_route
        from monarch_rdmafs.mount import fuse_unavailable_reason, prepare_mount_point

        why = fuse_unavailable_reason()
        if why:
            raise RuntimeError(f"gather_mount needs FUSE here: {why}")
        rt = host_mesh._rt()  # the runtime of the mesh's job (a client may talk to several)
        hosts = []
        for i, h in enumerate(host_mesh.hosts):
            key = point_key(host_mesh, i)
            hosts.append([h.addr, key, remote_mount_point.replace("$SUBDIR", key)])
        if len(hosts) > 1 and any(not k for _, k, _ in hosts):
            raise ValueError("a mesh of several hosts needs named dimensions for gather_mount")
        self._local_mount_point = os.path.abspath(local_mount_point)
        prepare_mount_point(self._local_mount_point)
        # The mount's own process reaches the hosts as this one does (a Kubernetes port-forward too).
        config = {"keys": rt.keys.as_dict(), "hosts": hosts, "mountpoint": self._local_mount_point,
                  "route": current_route(rt)}
        # Keys go through a pipe, never the command line (where `ps` would show them); the
        # mount ends when its stdin closes.
        self._proc = HelperProcess([sys.executable, "-m", "monarch.gather_mount"])
        self._proc.start((json.dumps(config) + "\n").encode())
        line = self._proc.wait_ready(_READY_TIMEOUT_S)
        if line != "ready":
            self.close()
            raise RuntimeError(f"gather_mount at {self._local_mount_point} failed to start: {line or 'no answer'}")

    def close(self) -> None:
        """Unmount (safe to call twice)."""
        from monarch_rdmafs.mount import is_mounted, unmount

        self._proc.stop(time.monotonic() + _STOP_TIMEOUT_S)
        if is_mounted(self._local_mount_point):
            unmount(self._local_mount_point)

    def __enter__(self) -> "GatherMount":
        return self

    def __exit__(self, *_: object) -> bool:
        self.close()
        return False


def gather_mount(host_mesh: Any, remote_mount_point: str, local_mount_point: str) -> GatherMount:
    """Mount ``remote_mount_point`` of every host of ``host_mesh`` under ``local_mount_point``, read-only."""
    return GatherMount(host_mesh, remote_mount_point, local_mount_point)


# -- the mount process --------------------------------------------------------------


class _Hosts:
    """gather_fs's Remote: each call is one request to the host's workspace service."""

    def __init__(self, rt: Any, hosts: list):
        self.rt = rt
        self.by_key = {key: (addr, root) for addr, key, root in hosts}
        self.keys = [key for _, key, _ in hosts]

    def _ask(self, key: str, make: Any) -> Any:
        import errno

        addr, _ = self.by_key[key]
        try:
            return self.rt.request(addr, make).get(timeout=_CALL_TIMEOUT_S)
        except Exception:
            return errno.EIO  # the host is gone or did not answer: an I/O error, not a crash

    def _abs(self, key: str, rel: str) -> str:
        root = self.by_key[key][1]
        return os.path.join(root, rel) if rel else root

    def stat(self, key: str, rel: str):
        from monarch_rdmafs.messages import WsStat

        return self._ask(key, lambda port: WsStat(self._abs(key, rel), port))

    def listdir(self, key: str, rel: str):
        from monarch_rdmafs.messages import WsListDir

        return self._ask(key, lambda port: WsListDir(self._abs(key, rel), port))

    def read(self, key: str, rel: str, offset: int, size: int):
        from monarch_rdmafs.messages import WsRead

        return self._ask(key, lambda port: WsRead(self._abs(key, rel), offset, size, port))


def _main() -> None:
    import signal

    import pyfuse3
    import trio

    from monarch_agents.keys import JobKeys
    from monarch_agents.client import ensure_runtime
    from monarch_rdmafs.gather_fs import GatherFS
    from monarch_rdmafs.mount import _STOP_SIGNALS, _die_with_parent, stop_on_signals, unmount

    _die_with_parent()
    config = json.loads(sys.stdin.buffer.readline())
    rt = ensure_runtime(JobKeys(**config["keys"]), reach=[addr for addr, _, _ in config["hosts"]],
                        route=config.get("route"))
    ops = GatherFS(_Hosts(rt, config["hosts"]))
    mnt = config["mountpoint"]
    options = set(pyfuse3.default_options) | {"fsname=monarch-gather", "ro"}
    options.discard("default_permissions")
    out = os.fdopen(os.dup(1), "w", buffering=1)

    async def until_stdin_closes(scope) -> None:
        stream = trio.lowlevel.FdStream(os.dup(0))
        while await stream.receive_some(4096):
            pass
        scope.cancel()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(stop_on_signals, nursery.cancel_scope)
            nursery.start_soon(until_stdin_closes, nursery.cancel_scope)
            out.write("ready\n")
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    for sig in _STOP_SIGNALS:  # a stop while unmounting is ignored, not fatal
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # until stop_on_signals listens
    try:
        pyfuse3.init(ops, mnt, options)
    except Exception as e:
        out.write(f"mount failed: {e}\n")
        raise SystemExit(1)
    try:
        trio.run(run)
    except BaseException:
        pyfuse3.close(unmount=False)
        unmount(mnt)
        raise
    pyfuse3.close(unmount=True)
    rt.close()


if __name__ == "__main__":
    _main()
