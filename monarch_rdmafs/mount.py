"""Serving one synced tree at a mount point: a FUSE mount process, or a materialized directory.

:class:`FuseMount` runs ``python -m monarch_rdmafs.mount`` (this module's
``main``), a small process that mounts :class:`~monarch_rdmafs.fs.WorkspaceFS`
and switches generations when told on its stdin.  It unmounts when told to
stop, on SIGTERM, when its stdin closes, and when its parent dies
(``PR_SET_PDEATHSIG``), so an agent's death leaves no mount; a ``kill -9`` of
the mount process itself leaves a dead mount that its owner (or the next agent
of the job, at start: :func:`unmount_stale`) removes lazily.

Where FUSE cannot be used, :class:`MaterializedMount` writes each generation
out as a read-only directory and switches a symlink at the mount point in one
``rename``.

Mounts carry ``fsname=<store root>`` and ``subtype=monarch-rdmafs``, so the
mounts of one job's host are found again in ``/proc/self/mounts``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from monarch_rdmafs.errors import SyncError
from monarch_rdmafs.helper import HelperProcess, Spawn
from monarch_rdmafs.manifest import CHUNK_SIZE, DIR, FILE, LINK, Manifest
from monarch_rdmafs.private import check_mount_parent, make_dirs
from monarch_rdmafs.store import ChunkStore

log = logging.getLogger("monarch.rdmafs.mount")

SUBTYPE = "monarch-rdmafs"
_READY_TIMEOUT_S = 20.0
_SWITCH_TIMEOUT_S = 60.0


def fuse_unavailable_reason() -> str:
    """Why FUSE cannot be used here ('' when it can); ``MONARCH_RDMAFS_NO_FUSE=1`` turns it off."""
    if os.environ.get("MONARCH_RDMAFS_NO_FUSE") == "1":
        return "MONARCH_RDMAFS_NO_FUSE=1"
    try:
        import pyfuse3  # noqa: F401
    except ImportError as e:
        return (f"pyfuse3 is not installed ({e}; apt-get install fuse3 libfuse3-dev pkg-config, "
                "then pip install 'monarch-workbench[fuse]')")
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return f"/dev/fuse cannot be opened ({e.strerror})"
    if os.getuid() != 0 and shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    return ""


def mounts_of(fsname: str) -> list[str]:
    """Mount points of every monarch-rdmafs mount whose fsname is ``fsname``."""
    found = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == f"fuse.{SUBTYPE}" and _unescape(parts[0]) == fsname:
                    found.append(_unescape(parts[1]))
    except OSError:
        pass
    return found


def is_mounted(path: str) -> bool:
    path = os.path.abspath(path)
    try:
        with open("/proc/self/mounts") as f:
            return any(len(p) >= 2 and _unescape(p[1]) == path for p in (line.split() for line in f))
    except OSError:
        return False


def unmount(path: str) -> None:
    """Unmount ``path`` lazily (busy or dead mounts included); quiet if it is not mounted."""
    for cmd in (["fusermount3", "-u", "-z", path], ["umount", "-l", path]):
        try:
            if subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0:
                return
        except (OSError, subprocess.TimeoutExpired):
            continue


def unmount_stale(store_root: str) -> list[str]:
    """Unmount every mount left by an earlier agent over this store (it died, or was killed)."""
    stale = mounts_of(os.path.abspath(store_root))
    for path in stale:
        log.warning("unmounting a stale workspace mount left at %s", path)
        unmount(path)
    return stale


def prepare_mount_point(path: str) -> None:
    """Make ``path`` an empty directory to mount on, clearing a dead mount or an old fallback link."""
    make_dirs(os.path.dirname(path))
    check_mount_parent(path)
    if os.path.islink(path):
        os.unlink(path)
    try:
        make_dirs(path)
    except (FileExistsError, OSError):
        unmount(path)  # a dead FUSE mount fails stat with ENOTCONN
        make_dirs(path)
    if is_mounted(path):
        unmount(path)


class FuseMount:
    """A mount process serving the store's manifests at ``mountpoint``."""

    kind = "fuse"

    def __init__(self, store: ChunkStore, mountpoint: str, spawn: Spawn | None = None):
        """``spawn``: how the mount process is started (a host agent's zygote forks one with FUSE
        imported already: a fork instead of an interpreter, ~18 MiB and 0.12 CPU-s a host);
        ``None``: a new interpreter."""
        self.store = store
        self.mountpoint = os.path.abspath(mountpoint)
        self.spawn = spawn
        self.proc: HelperProcess | None = None
        self._lock = threading.Lock()

    @staticmethod
    def warm(store: ChunkStore, spawn: Spawn | None = None) -> HelperProcess:
        """A mount process started ahead, with its interpreter and FUSE imports paid (most of what a
        first mount waits for): :meth:`start` hands it a manifest and a mount point; ``stop()`` it
        if none comes."""
        helper = HelperProcess([sys.executable, "-m", "monarch_rdmafs.mount", "--store", store.root], spawn=spawn)
        helper.start()
        return helper

    def start(self, manifest_id: str, warm: HelperProcess | None = None) -> None:
        """Mount, serving ``manifest_id``: in ``warm`` (from :meth:`warm`, for this store) if it
        still runs, else in a process started now."""
        prepare_mount_point(self.mountpoint)
        if warm is not None and warm.alive:
            self.proc = warm
            try:
                warm.send((json.dumps({"manifest": manifest_id, "mountpoint": self.mountpoint}) + "\n").encode())
            except OSError:
                pass  # it died meanwhile: wait_ready says so
        else:
            if warm is not None:
                warm.stop(time.monotonic())
            cmd = [sys.executable, "-m", "monarch_rdmafs.mount", "--store", self.store.root, "--manifest", manifest_id,
                   self.mountpoint]
            self.proc = HelperProcess(cmd, spawn=self.spawn)
            self.proc.start()
        line = self.proc.wait_ready(_READY_TIMEOUT_S)
        if line != "ready":
            self.stop()
            raise SyncError(f"the workspace mount at {self.mountpoint} failed to start: {line or 'no answer'}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive

    def switch(self, manifest_id: str) -> None:
        """Serve ``manifest_id`` from now on; returns once the switch is visible at the mount point."""
        with self._lock:
            if not self.alive:
                raise SyncError(f"the workspace mount at {self.mountpoint} is not running")
            assert self.proc is not None
            self.proc.send(f"switch {manifest_id}\n".encode())
            line = self.proc.read_line(_SWITCH_TIMEOUT_S)
        if line != f"ok {manifest_id}":
            raise SyncError(f"the workspace mount at {self.mountpoint} did not switch: {line or 'no answer'}")

    def stop(self, timeout: float = 5.0) -> None:
        """Unmount and end the mount process; safe to call twice."""
        if self.proc is not None:
            self.proc.stop(time.monotonic() + timeout)
        if is_mounted(self.mountpoint):
            unmount(self.mountpoint)


class MaterializedMount:
    """The fallback where FUSE cannot be used: each generation a read-only directory, the mount point a symlink."""

    kind = "materialized"

    def __init__(self, store: ChunkStore, mountpoint: str):
        self.store = store
        self.mountpoint = os.path.abspath(mountpoint)
        self.gens_dir = os.path.join(store.root, "materialized", _slug(self.mountpoint))
        self.current = ""

    @property
    def alive(self) -> bool:
        return True

    def start(self, manifest_id: str) -> None:
        if os.path.isdir(self.mountpoint) and not os.path.islink(self.mountpoint):
            if os.listdir(self.mountpoint):
                raise SyncError(f"{self.mountpoint} is a non-empty directory; the materialized workspace needs it free")
            os.rmdir(self.mountpoint)
        self.switch(manifest_id)

    def switch(self, manifest_id: str) -> None:
        manifest = Manifest.from_bytes(self.store.get(manifest_id))
        dest = os.path.join(self.gens_dir, manifest_id)
        if not os.path.isdir(dest):
            materialize(self.store, manifest, dest)
        make_dirs(os.path.dirname(self.mountpoint))
        check_mount_parent(self.mountpoint)
        tmp = f"{self.mountpoint}.tmp-{os.getpid()}"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(dest, tmp)
        os.replace(tmp, self.mountpoint)  # the switch: one rename
        previous, self.current = self.current, manifest_id
        for name in os.listdir(self.gens_dir):
            if name not in (manifest_id, previous) and not name.startswith("."):
                _remove_tree(os.path.join(self.gens_dir, name))

    def stop(self, timeout: float = 5.0) -> None:
        if os.path.islink(self.mountpoint):
            os.unlink(self.mountpoint)
        _remove_tree(self.gens_dir)


def materialize(store: ChunkStore, manifest: Manifest, dest: str) -> None:
    """Write ``manifest``'s tree under ``dest`` from the store (read-only files), atomically."""
    tmp = f"{dest}.part-{os.getpid()}"
    _remove_tree(tmp)
    dirs = []
    for e in manifest.entries:
        path = os.path.join(tmp, e.path) if e.path else tmp
        if e.kind == DIR:
            make_dirs(path)
            dirs.append((path, e))
        elif e.kind == LINK:
            os.symlink(e.target, path)
        elif e.kind == FILE:
            with open(path, "xb") as out:  # x: never through a link or over a file already there
                for cid in e.chunks:
                    out.write(store.get(cid))  # checked against its hash: a swapped chunk fails the sync
            os.chmod(path, e.mode & ~0o222)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns))
    for path, e in reversed(dirs):
        os.chmod(path, (e.mode | 0o500) & ~0o222)
        os.utime(path, ns=(e.mtime_ns, e.mtime_ns))
    os.replace(tmp, dest)


def _remove_tree(path: str) -> None:
    if not os.path.lexists(path):
        return
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
    os.chmod(path, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _slug(path: str) -> str:
    from monarch_rdmafs.manifest import chunk_id

    return chunk_id(path.encode())[:16]


def _unescape(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


# -- the mount process ----------------------------------------------------------------


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m monarch_rdmafs.mount", description="serve a synced tree read-only")
    p.add_argument("--store", required=True)
    p.add_argument("--manifest", default="", help="without it (and the mount point): started ahead, told both "
                                                   "on stdin as one JSON line when the first commit comes")
    p.add_argument("mountpoint", nargs="?", default="")
    args = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("MONARCH_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _die_with_parent()
    if os.getppid() == 1:
        return  # the parent is already gone

    import pyfuse3
    import trio

    from monarch_rdmafs.fs import WorkspaceFS

    if not args.manifest:
        # Started ahead (FuseMount.warm): the imports above are paid; now wait for what to serve.
        line = _read_line(0)
        if not line:
            return  # the agent let it go unused
        start = json.loads(line)
        args.manifest, args.mountpoint = start["manifest"], start["mountpoint"]
    store = ChunkStore(args.store)
    ops = WorkspaceFS(store, Manifest.from_bytes(store.get(args.manifest)))
    options = set(pyfuse3.default_options)
    options.discard("default_permissions")
    options |= {f"fsname={store.root}", f"subtype={SUBTYPE}", "ro"}
    out = os.fdopen(os.dup(1), "w", buffering=1)

    async def control(nursery) -> None:
        stream = trio.lowlevel.FdStream(os.dup(0))
        buf = b""
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd, _, arg = line.decode().partition(" ")
                if cmd != "switch":
                    out.write(f"err unknown command {cmd!r}\n")
                    continue
                try:
                    stale = ops.switch(Manifest.from_bytes(store.get(arg)))
                    await trio.to_thread.run_sync(_invalidate, stale)
                    out.write(f"ok {arg}\n")
                except Exception as e:  # told to the agent, which reports it
                    out.write(f"err {type(e).__name__}: {e}\n")
        nursery.cancel_scope.cancel()

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(stop_on_signals, nursery.cancel_scope)  # before "ready": a stop from then on unmounts
            nursery.start_soon(control, nursery)
            out.write("ready\n")
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    # A stop signal between mounting and listening for it would leave the mount: held until then;
    # and one after the listener is gone (while unmounting) is ignored, not fatal.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pyfuse3.init(ops, args.mountpoint, options)
    except Exception as e:
        out.write(f"mount failed: {e}\n")
        raise SystemExit(1)
    # Once the kernel's INIT is answered (a file is opened only after): that answer caps read-ahead.
    ops.first_open = lambda: _raise_readahead(args.mountpoint)
    try:
        trio.run(run)
    except BaseException:
        log.exception("the mount loop failed; unmounting %s", args.mountpoint)
        pyfuse3.close(unmount=False)
        unmount(args.mountpoint)
        raise
    finally:
        ops.close_files()
    log.debug("unmounting %s", args.mountpoint)
    pyfuse3.close(unmount=True)
    log.debug("unmounted %s", args.mountpoint)


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _read_line(fd: int) -> bytes:
    """One line from ``fd``, a byte at a time: nothing after it is read (the control loop reads on)."""
    line = b""
    while not line.endswith(b"\n"):
        b = os.read(fd, 1)
        if not b:
            return b""
        line += b
    return line


async def stop_on_signals(scope, task_status) -> None:
    """Cancel ``scope`` (ending ``pyfuse3.main``, so the mount is closed) on SIGTERM, SIGINT or SIGHUP.

    Started once it listens.  Cancelling rather than ``pyfuse3.terminate()``: a signal may come
    before ``pyfuse3.main`` runs, when there is no main loop to terminate yet.
    """
    import trio

    with trio.open_signal_receiver(*_STOP_SIGNALS) as received:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        task_status.started()
        async for _ in received:
            scope.cancel()
            return


#: How far the kernel reads ahead in a file of the mount: four chunks.  Its default (128 KiB)
#: made every read of a big file a 128 KiB request to this process (4 KiB per read() of 1 MiB at
#: a time, 4,096 requests for 256 MiB); with this it asks 1 MiB at a time (libfuse's largest) and
#: keeps up to 16 in flight, so a reply this process makes late (a loaded machine) stalls no reader.
READAHEAD_KB = 4 * CHUNK_SIZE >> 10


def _raise_readahead(mountpoint: str) -> None:
    """Set the mount's read-ahead (``/sys/class/bdi/<dev>/read_ahead_kb``; root only, else left as is).

    Called from this process's loop (the first open), after the kernel took libfuse's INIT answer,
    which lowers it to what the kernel offered (128 KiB).  The device number comes from
    /proc/self/mountinfo: a ``stat`` of the mount point would be a request to this very process.
    """
    # The folder above resolved, not the mount point itself (that would be a request too).
    where = os.path.join(os.path.realpath(os.path.dirname(mountpoint)), os.path.basename(mountpoint))
    try:
        with open("/proc/self/mountinfo") as f:
            devs = [ln.split()[2] for ln in f if _unescape(ln.split()[4]) == where]
        if devs:
            with open(f"/sys/class/bdi/{devs[-1]}/read_ahead_kb", "w") as f:
                f.write(str(READAHEAD_KB))
    except (OSError, IndexError) as e:
        log.debug("read-ahead of %s left as it is: %s", mountpoint, e)


def _invalidate(stale: list[tuple[int, bytes]]) -> None:
    import pyfuse3

    for parent, name in stale:
        try:
            pyfuse3.invalidate_entry(parent, name)
        except OSError:
            pass  # the kernel never looked it up


if __name__ == "__main__":
    main()
