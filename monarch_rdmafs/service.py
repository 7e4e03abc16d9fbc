"""The workspace service of a host agent: receive chunks, forward them, and serve mounts of synced trees.

The agent routes the messages of :mod:`monarch_rdmafs.messages` here
(:meth:`WorkspaceService.handlers`), adds :meth:`WorkspaceService.status` to its
own, and calls :meth:`WorkspaceService.stop` when it stops.  Batches are
forwarded the moment they arrive (on the agent's IO thread) and stored by one
worker thread, so the agent keeps answering while chunks are written.

At start it unmounts any mount an earlier agent of this job's host left over
its store (the agent was killed), and empties the store's temp folder.  Its root
(mode 0700) is made when the first chunk arrives, not before.  Each
mount is a FUSE mount process (restarted if it dies) or, where FUSE cannot be
used, a materialized directory; the reason is logged once and shown in status.

What it does not do: RDMA transfers (see :mod:`monarch_rdmafs.rdma`), or serve
trees to anyone but the job's authenticated client (the agent's transport
admits no one else).
"""

from __future__ import annotations

import logging
import os
import queue
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from monarch_rdmafs import messages as wm
from monarch_rdmafs.errors import StoreFull, SyncError
from monarch_rdmafs.helper import HelperProcess, Spawn
from monarch_rdmafs.manifest import Manifest
from monarch_rdmafs.mount import FuseMount, MaterializedMount, fuse_unavailable_reason, unmount_stale
from monarch_rdmafs.private import UnsafeFolder, private_dir
from monarch_rdmafs.rdma import choose_transport
from monarch_rdmafs.store import ChunkStore

log = logging.getLogger("monarch.rdmafs.service")

#: Chunks no kept generation uses are removed once they are this old (a sync in flight may still need newer ones).
_GC_AGE_S = 600.0
_WATCH_MOUNTS_S = 0.5
#: At most one garbage collection of the store this often (it lists every chunk).
_GC_EVERY_S = 60.0
_READ_MAX = 32 << 20


@dataclass
class _Mount:
    name: str
    server: FuseMount | MaterializedMount
    manifest: Manifest
    source: str = ""
    previous: str = ""
    synced_at: float = field(default_factory=time.time)
    syncs: int = 1
    restarts: int = 0


class WorkspaceService:
    """Chunk store, fan-out and mounts of one host.

    ``send(addr, msg)`` sends a message; ``reply(port, value, ok)`` answers a port; ``addr()`` is this
    host's own address (it names the host in acknowledgements).
    """

    name = "workspace"

    def __init__(self, root: str, *, host: str, host_rank: int, send: Callable[[str, Any], None],
                 reply: Callable[[Any, Any, bool], None], addr: Callable[[], str] = lambda: "",
                 private_top: str | None = None, spawn: Spawn | None = None):
        """``spawn``: how mount processes start (see :class:`~monarch_rdmafs.mount.FuseMount`)."""
        self.root = os.path.abspath(root)
        self._spawn = spawn
        #: The highest folder that must be private along with the root (see ``monarch_rdmafs.private``).
        self._private_top = private_top
        self.host = host
        self.host_rank = host_rank
        self._send = send
        self._reply = reply
        self._addr = addr
        # The root is made with the first chunk (see _store_batch): a host never synced to leaves nothing.
        self.store = ChunkStore(os.path.join(self.root, "store"))
        self.stale_unmounted = unmount_stale(self.store.root)
        self.store.clean()
        self._fuse_reason: str | None = None  # learned at the first mount (pyfuse3 costs an import)
        self.transport = choose_transport()
        self.mounts: dict[str, _Mount] = {}
        #: A mount process started ahead of a first commit (see _missing); the worker thread's.
        self._warm: HelperProcess | None = None
        self.bytes_received = 0
        self._last_gc = time.monotonic()
        self.chunks_received = 0
        self._lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        #: Set at the first mount (and at stop): until then the watcher sleeps without waking.
        self._watching = threading.Event()
        self._worker = threading.Thread(target=self._work, name="workspace-store", daemon=True)
        self._worker.start()
        self._watcher = threading.Thread(target=self._watch_mounts, name="workspace-mounts", daemon=True)
        self._watcher.start()

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {
            wm.WsMissing: lambda msg: self._jobs.put((self._missing, msg)),
            wm.WsChunks: self.on_chunks,
            wm.WsCommit: lambda msg: self._jobs.put((self._commit, msg)),
            wm.WsUnmount: lambda msg: self._jobs.put((self._unmount, msg)),
            wm.WsStatus: lambda msg: self._reply(msg.reply, self.status(), True),
            wm.WsListDir: lambda msg: self._jobs.put((self._list_dir, msg)),
            wm.WsStat: lambda msg: self._jobs.put((self._stat, msg)),
            wm.WsRead: lambda msg: self._jobs.put((self._read, msg)),
        }

    # -- chunks -------------------------------------------------------------------

    def on_chunks(self, msg: wm.WsChunks) -> None:
        # Forward first: the hosts below start receiving while this one writes.
        for nxt, rest in msg.subtrees():
            try:
                self._send(nxt, wm.WsChunks(msg.sync_id, msg.batch, msg.ids, msg.sizes, msg.payload, rest,
                                            msg.fanout, msg.reply))
            except Exception as e:  # the client learns of that host's death from its own connection
                log.warning("could not forward batch %d to %s: %s", msg.batch, nxt, e)
        self._jobs.put((self._store_batch, msg))

    def _store_batch(self, msg: wm.WsChunks) -> None:
        self._reply(msg.reply, self._store(msg), True)

    def _store(self, msg: wm.WsChunks) -> wm.WsBatchDone:
        """Store what ``msg`` carries that this host lacks; what came of it."""
        stored = 0
        corrupt: list[str] = []
        try:
            private_dir(self.root, top=self._private_top)
            # Small chunks together in one pack file, big ones in files of their own (see ChunkStore.put_many).
            stored, size, corrupt = self.store.put_many(msg.chunks())
            self.bytes_received += size
            self.chunks_received += stored
            done = wm.WsBatchDone(self._addr(), msg.batch, stored, corrupt)
        except StoreFull as e:
            done = wm.WsBatchDone(self._addr(), msg.batch, stored, corrupt, f"{e.message} ({e.hint})")
        except UnsafeFolder as e:
            done = wm.WsBatchDone(self._addr(), msg.batch, stored, corrupt, f"{self.host}: {e.message} ({e.hint})")
        except OSError as e:
            done = wm.WsBatchDone(self._addr(), msg.batch, stored, corrupt, f"cannot store chunks: {e}")
        return done

    def _missing(self, msg: wm.WsMissing) -> None:
        self._reply(msg.reply, self.store.missing(msg.ids), True)
        # A sync begins: a first mount will follow its chunks.  Its process starts now, so that its
        # interpreter and FUSE imports (most of a first commit's wait) overlap the transfer.
        with self._lock:
            want = not self.mounts and self._warm is None and not self._stopping.is_set()
        if want and not self.fuse_reason:
            warm = FuseMount.warm(self.store, self._spawn)
            with self._lock:
                if not self._stopping.is_set():
                    warm, self._warm = None, warm
            if warm is not None:  # the service stopped meanwhile
                warm.stop(time.monotonic() + 1.0)

    # -- mounts -------------------------------------------------------------------

    @property
    def fuse_reason(self) -> str:
        """Why this host cannot use FUSE ('' when it can); said once, in the log."""
        if self._fuse_reason is None:
            self._fuse_reason = fuse_unavailable_reason()
            if self._fuse_reason:
                log.warning("FUSE cannot be used on %s (%s): workspaces are materialized as directories instead",
                            self.host, self._fuse_reason)
        return self._fuse_reason

    def place(self, cwd: str | None, env: dict) -> tuple[str | None, dict]:
        """Where a command started from the client's ``cwd`` runs here, and its environment.

        With a synced workspace, a command started in it (or below) starts at the same place in
        the mount, with the mount first on ``PYTHONPATH``; a synced environment's ``bin`` leads ``PATH``.
        """
        with self._lock:
            ws, venv = self.mounts.get("workspace"), self.mounts.get("env")
        if ws is not None:
            mnt = ws.server.mountpoint
            if ws.source and (cwd is None or cwd == ws.source or cwd.startswith(ws.source + os.sep)):
                cwd = os.path.normpath(os.path.join(mnt, os.path.relpath(cwd or ws.source, ws.source)))
            env["PYTHONPATH"] = mnt + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            env["MONARCH_WORKSPACE"] = mnt
        if venv is not None:
            env["VIRTUAL_ENV"] = venv.server.mountpoint
            env["PATH"] = os.path.join(venv.server.mountpoint, "bin") + os.pathsep + env.get("PATH", os.defpath)
        return cwd, env

    def default_mountpoint(self, name: str) -> str:
        return os.path.join(self.root, "mnt", name)

    def _commit(self, msg: wm.WsCommit) -> None:
        try:
            inline = getattr(msg, "inline", None)
            if inline is not None:
                # An edit's chunks ride in its switch: stored first; if they could not all be, the
                # answer says so (a WsBatchDone) and this host keeps serving what it served.
                done = self._store(inline)
                if done.error or done.corrupt:
                    self._reply(msg.reply, done, True)
                    return
            self._reply(msg.reply, self.commit(msg.name, msg.manifest_id, msg.mountpoint, msg.source), True)
            if time.monotonic() - self._last_gc > _GC_EVERY_S:
                self._last_gc = time.monotonic()
                self._gc()  # after the answer: the sync does not wait for it
        except (SyncError, UnsafeFolder) as e:
            self._reply(msg.reply, RuntimeError(f"{self.host}: {e.message}" + (f" ({e.hint})" if e.hint else "")), False)
        except Exception as e:
            log.exception("commit failed")
            self._reply(msg.reply, RuntimeError(f"{self.host}: could not switch the workspace: {e}"), False)

    def commit(self, name: str, manifest_id: str, mountpoint: str = "", source: str = "") -> dict:
        """Serve ``manifest_id`` at mount ``name``; every chunk it names must be in the store."""
        if not self.store.has(manifest_id):
            raise SyncError(f"manifest {manifest_id[:12]} never arrived", "sync again")
        manifest = Manifest.from_bytes(self.store.get(manifest_id))
        missing = self.store.missing(manifest.chunk_ids())
        if missing:
            raise SyncError(f"{len(missing)} chunk(s) of the new workspace never arrived", "sync again")
        mountpoint = os.path.abspath(mountpoint or self.default_mountpoint(name))
        with self._lock:
            mount = self.mounts.get(name)
        if mount is not None and mount.server.mountpoint != mountpoint:
            self._stop_mount(name)
            mount = None
        if mount is None:
            if self.fuse_reason:
                server = MaterializedMount(self.store, mountpoint)
                server.start(manifest_id)
            else:
                server = FuseMount(self.store, mountpoint, self._spawn)
                with self._lock:
                    warm, self._warm = self._warm, None
                server.start(manifest_id, warm)
            mount = _Mount(name, server, manifest, source)
            with self._lock:
                self.mounts[name] = mount
            self._watching.set()
        elif mount.manifest.id != manifest_id:
            mount.server.switch(manifest_id)
            mount.previous, mount.manifest = mount.manifest.id, manifest
            mount.synced_at = time.time()
            mount.syncs += 1
        else:
            mount.synced_at = time.time()
        mount.source = source
        return self._mount_status(mount)

    def _unmount(self, msg: wm.WsUnmount) -> None:
        self._reply(msg.reply, self._stop_mount(msg.name), True)

    def _stop_mount(self, name: str) -> bool:
        with self._lock:
            mount = self.mounts.pop(name, None)
        if mount is None:
            return False
        mount.server.stop()
        return True

    def _watch_mounts(self) -> None:
        # A mount process killed (even with -9) leaves a dead mount: remove it and serve again.
        # No wake-ups before a first mount: 256 idle agents polling twice a second was CPU for nothing.
        self._watching.wait()
        while not self._stopping.wait(_WATCH_MOUNTS_S):
            with self._lock:
                dead = [mt for mt in self.mounts.values() if not mt.server.alive]
            for mt in dead:
                if self._stopping.is_set():
                    return
                log.warning("the workspace mount process at %s died; mounting again", mt.server.mountpoint)
                mt.server.stop()
                try:
                    mt.server.start(mt.manifest.id)
                    mt.restarts += 1
                except Exception as e:
                    log.error("could not mount %s again: %s", mt.server.mountpoint, e)
                    with self._lock:
                        self.mounts.pop(mt.name, None)

    def _gc(self) -> None:
        keep: set[str] = set()
        with self._lock:
            mounts = list(self.mounts.values())
        for mt in mounts:
            keep.add(mt.manifest.id)
            keep |= mt.manifest.chunk_ids()
            if mt.previous and self.store.has(mt.previous):
                keep.add(mt.previous)
                try:
                    keep |= Manifest.from_bytes(self.store.get(mt.previous)).chunk_ids()
                except (OSError, ValueError, SyncError):
                    pass
        self.store.gc(keep, older_than=time.time() - _GC_AGE_S)

    # -- gather_mount: reading the host's own files -----------------------------------

    def _list_dir(self, msg: wm.WsListDir) -> None:
        try:
            rows = []
            with os.scandir(msg.path) as it:
                for d in it:
                    st = d.stat(follow_symlinks=False)
                    rows.append((d.name, st.st_mode, st.st_size, st.st_mtime_ns))
            self._reply(msg.reply, rows, True)
        except OSError as e:
            self._reply(msg.reply, e.errno or 5, True)

    def _stat(self, msg: wm.WsStat) -> None:
        try:
            st = os.lstat(msg.path)
            target = os.readlink(msg.path) if stat.S_ISLNK(st.st_mode) else ""
            self._reply(msg.reply, (st.st_mode, st.st_size, st.st_mtime_ns, target), True)
        except OSError as e:
            self._reply(msg.reply, e.errno or 5, True)

    def _read(self, msg: wm.WsRead) -> None:
        try:
            with open(msg.path, "rb") as f:
                data = os.pread(f.fileno(), min(msg.length, _READ_MAX), msg.offset)
            self._reply(msg.reply, data, True)
        except OSError as e:
            self._reply(msg.reply, e.errno or 5, True)

    # -- status and stop -------------------------------------------------------------

    def _mount_status(self, mt: _Mount) -> dict:
        return {
            "name": mt.name, "host": self.host, "mountpoint": mt.server.mountpoint, "mode": mt.server.kind,
            "fallback_reason": self.fuse_reason, "manifest": mt.manifest.id, "files": mt.manifest.files,
            "bytes": mt.manifest.total_bytes, "synced_at": mt.synced_at, "syncs": mt.syncs, "restarts": mt.restarts,
            "alive": mt.server.alive,
        }

    def status(self) -> dict:
        """What ``monarch status`` shows for this host's workspace."""
        with self._lock:
            mounts = [self._mount_status(mt) for mt in self.mounts.values()]
        return {
            "host": self.host, "host_rank": self.host_rank, "root": self.root, "mounts": mounts,
            "transport": self.transport.kind, "transport_reason": self.transport.reason,
            "received_bytes": self.bytes_received, "received_chunks": self.chunks_received,
        }

    def stop(self, deadline: float | None = None) -> None:
        """Unmount everything and stop the worker; safe to call twice."""
        self._stopping.set()
        self._watching.set()
        self._jobs.put(None)
        with self._lock:
            names = list(self.mounts)
        for name in names:
            self._stop_mount(name)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self._worker.join(left)
        with self._lock:  # a worker that starts one from now on stops it itself
            warm, self._warm = self._warm, None
        if warm is not None:
            warm.stop(time.monotonic() + 1.0)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self.store.close()  # on this thread, the store's one writer
                return
            fn, msg = job
            try:
                fn(msg)
            except Exception:
                log.exception("workspace job %s failed", type(msg).__name__)
