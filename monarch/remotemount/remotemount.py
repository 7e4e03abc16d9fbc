"""PyTorch Monarch's ``monarch.remotemount.remotemount``: a local folder mounted read-only on the
hosts of a mesh, its bytes delivered in blocks when a read needs them.

How a mount works (the names are Monarch's, and so is what each does):

* :func:`build_index` walks the source once into the *index*: virtual path -> node (``attr``;
  ``children`` for a folder; ``link_target`` for a link; ``global_offset``, ``file_len``,
  ``mtime_ns``, ``full_path`` for a file).  Every file is a range of one packed byte stream, cut
  into :data:`BLOCK_SIZE` blocks.  Against the previous index a file that did not change keeps its
  offset and a new or changed one is appended past the old end, block-aligned (small files
  first), so a block once delivered never changes.
* :func:`materialise_block` reads one block back from the source, checking each file against its
  size and mtime: a file that changed since is filled with random bytes and named, and its reads
  then fail with EIO (never old or torn bytes).
* On every proc of the mesh a :class:`FUSEActor` mounts the index (``monarch_rdmafs.blockfs``, a
  FUSE process per mount) with no block.  A read that needs a missing block asks the mount's
  :class:`RemoteMountLeader` (one per mount), which asks the owner's :class:`MountHandlerClient`
  once per block; the owner materialises it and sends it down the chain (``_chain``) to every
  worker; the leader waits until every worker holds it.  ``open`` sends the blocks of the small
  files at once; big ones come when read.
* ``refresh`` swaps a new index into every mount in one step; a file open across it reads the new
  bytes.  ``close`` unmounts and stops the workers.

``$SUBDIR`` in a mount point becomes each worker's coordinates (``hosts_0``, ...).
"""

from __future__ import annotations

import contextvars
import logging
import os
import subprocess
from typing import Any, Optional

from monarch.actor import Actor, endpoint
from monarch_rdmafs.blockfs import BLOCK_SIZE

logger = logging.getLogger(__name__)

__all__ = [
    "BIG_FILE_THRESHOLD", "BLOCK_SIZE", "CBC_CHUNK", "CBC_STREAMS", "FUSEActor", "MountHandler",
    "MountHandlerClient", "RemoteMountLeader", "build_index", "code_blocks", "materialise_block",
    "point_key", "prepare_mount_point", "remotemount",
]

#: Files smaller than this are "code", sent at ``open``; bigger ones come when a read needs them.
BIG_FILE_THRESHOLD: int = 1 << 20
#: How much of a block one message down the chain carries.
CBC_CHUNK: int = 64 * 1024
#: How much of a block one message of ours carries: a hop is a message of the job's transport, whose
#: cost is per message (64 KiB messages made a cold 128 MiB read ~3x slower than 4 MiB ones).
_SEND_CHUNK: int = 4 << 20
#: Monarch's parallel streams per chain hop; accepted, one ordered connection per hop here.
CBC_STREAMS: int = 128

#: Never mounted: the CLI's job state, rewritten at every command (it would change every refresh).
_EXCLUDED_DIRS = frozenset({".monarch"})
_ATTR_KEYS = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
#: How long a worker waits for a block to come down the chain (Monarch's figure).
_CHAIN_WAIT_MS = 120_000


def _attr(st: os.stat_result) -> dict:
    a = {k: getattr(st, k) for k in _ATTR_KEYS}
    # atime changes whenever the source is read (materialising does): the mount is read-only, so it
    # shows mtime, and an index of an unchanged tree equals the previous one.
    a["st_atime"] = a["st_mtime"]
    return a


def _child(vdir: str, name: str) -> str:
    return ("" if vdir == "/" else vdir) + "/" + name


# -- the index --------------------------------------------------------------------------


def build_index(source_path: str, previous: dict) -> dict:
    """The index of ``source_path`` (see the module's doc); ``previous={}`` packs afresh.

    The walk stays on the source's filesystem: a folder that is another mount is an empty folder
    in the index (a FUSE mount inside the source is never read through).  ``index['/']['total_size']``
    is the packed length.
    """
    root = os.path.abspath(source_path)
    root_st = os.stat(root)
    index: dict[str, Any] = {}
    moved: list[str] = []  # new or changed files: offsets given after the walk
    todo: list[tuple[str, str, os.stat_result]] = [(root, "/", root_st)]
    while todo:
        real, vdir, dir_st = todo.pop()
        names: list[str] = []
        with os.scandir(real) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            vpath = _child(vdir, e.name)
            if e.is_symlink():
                names.append(e.name)
                index[vpath] = {"attr": _attr(e.stat(follow_symlinks=False)), "link_target": os.readlink(e.path)}
                continue
            if e.is_dir(follow_symlinks=False):
                if e.name in _EXCLUDED_DIRS:
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    logger.warning("build_index: %s cannot be read; left out", e.path)
                    continue
                names.append(e.name)
                if st.st_dev == root_st.st_dev:
                    todo.append((e.path, vpath, st))
                else:
                    logger.warning("build_index: %s is another filesystem (a mount); shown empty", e.path)
                    index[vpath] = {"attr": _attr(st), "children": []}
                continue
            st = e.stat(follow_symlinks=False)
            names.append(e.name)
            node = {"attr": _attr(st), "file_len": st.st_size, "mtime_ns": st.st_mtime_ns, "full_path": e.path}
            old = previous.get(vpath)
            if old is not None and old.get("file_len") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns \
                    and "global_offset" in old:
                node["global_offset"] = old["global_offset"]
            else:
                moved.append(vpath)
            index[vpath] = node
        index[vdir] = {"attr": _attr(dir_st), "children": names}

    end = previous.get("/", {}).get("total_size", 0)
    if moved and end % BLOCK_SIZE:
        end += BLOCK_SIZE - end % BLOCK_SIZE  # appended bytes never share a block already sent
    small = [v for v in moved if index[v]["file_len"] < BIG_FILE_THRESHOLD]
    big = [v for v in moved if index[v]["file_len"] >= BIG_FILE_THRESHOLD]
    for vpath in small + big:
        index[vpath]["global_offset"] = end
        end += index[vpath]["file_len"]
    index["/"]["total_size"] = end
    return index


def code_blocks(index: dict) -> set[int]:
    """The blocks holding at least one non-empty file under :data:`BIG_FILE_THRESHOLD` (sent at ``open``)."""
    out: set[int] = set()
    for node in index.values():
        off = node.get("global_offset")
        size = node.get("file_len", 0)
        if off is None or not 0 < size < BIG_FILE_THRESHOLD:
            continue
        out.update(range(off // BLOCK_SIZE, (off + size - 1) // BLOCK_SIZE + 1))
    return out


def materialise_block(index: dict, block: int, buf: bytearray) -> tuple[bytes, int, list[str]]:
    """Block ``block`` read from the source into ``buf`` (``BLOCK_SIZE`` bytes, reused between calls).

    Returns ``(data, used, diverged)``: the block's ``BLOCK_SIZE`` bytes; how many of them, from the
    start, any file reaches (0 if none); and the files that changed since ``index`` was built,
    whose bytes in the block are random.  Bytes no file covers are whatever ``buf`` held.  A
    block past the packed end raises ``ValueError``.
    """
    total = index["/"]["total_size"]
    lo_block = block * BLOCK_SIZE
    if lo_block >= total:
        raise ValueError(f"block {block} is beyond the packed data ({total} bytes): the index is stale "
                         "or the block id is wrong")
    hi_block = lo_block + BLOCK_SIZE
    view = memoryview(buf)
    used = 0
    diverged: list[str] = []
    for vpath, node in index.items():
        off = node.get("global_offset")
        if off is None:
            continue
        lo, hi = max(off, lo_block), min(off + node["file_len"], hi_block)
        if lo >= hi:
            continue
        used = max(used, hi - lo_block)
        dst = view[lo - lo_block:hi - lo_block]
        if not _read_exact(node, lo - off, dst):
            diverged.append(vpath)
            dst[:] = os.urandom(hi - lo)
    return bytes(buf), used, diverged


def _read_exact(node: dict, start: int, dst: memoryview) -> bool:
    """Fill ``dst`` from the file at ``start`` if it is still what the index says (size and mtime)."""
    try:
        st = os.stat(node["full_path"], follow_symlinks=False)
        if st.st_size != node["file_len"] or st.st_mtime_ns != node["mtime_ns"]:
            return False
        with open(node["full_path"], "rb", buffering=0) as f:
            f.seek(start)
            got = 0
            while got < len(dst):
                n = f.readinto(dst[got:])
                if not n:
                    return False
                got += n
        return True
    except OSError:
        return False


# -- the workers -------------------------------------------------------------------------


def prepare_mount_point(path: str) -> None:
    """Make ``path`` a folder to mount on (0700 where made), clearing a dead mount left there;
    ``UnsafeFolder`` if another user could swap it."""
    from monarch_rdmafs.mount import is_mounted, unmount
    from monarch_rdmafs.private import check_mount_parent, make_dirs

    make_dirs(os.path.dirname(path))
    check_mount_parent(path)  # another user could swap what is mounted in a folder they may write
    try:
        make_dirs(path)
    except (FileExistsError, OSError):
        unmount(path)  # a dead FUSE mount fails stat with ENOTCONN
        make_dirs(path)
    if is_mounted(path) and not os.listdir(path):
        unmount(path)


def _point_key(point: Any) -> str:
    return "_".join(f"{k}_{v}" for k, v in dict(point).items()) if point else ""


def _resolve(path: str) -> str:
    """``path`` with ``$SUBDIR`` replaced by this actor's coordinates."""
    if "$SUBDIR" not in path:
        return path
    from monarch.actor import context

    return path.replace("$SUBDIR", _point_key(context().actor_instance.rank))


def _linear_rank() -> int:
    from monarch.actor import context

    rank = context().actor_instance.rank
    return int(getattr(rank, "rank", 0))


class FUSEActor(Actor):
    """A worker of a mount: its FUSE mount, and its end of the chain that brings blocks.

    ``handler`` is where a read's missing block is reported (its ``enqueue`` endpoint): the mount's
    :class:`RemoteMountLeader`; anything without ``enqueue`` (None) means nobody is told."""

    def __init__(self, handler: Any = None):
        self._handler = handler if hasattr(handler, "enqueue") else None
        self._mount: Any = None
        self._mountpoint: Optional[str] = None
        self._chain: Any = None
        self._ctx: Any = None

    @endpoint
    def mount(self, mount_point: str, meta: dict) -> None:
        """Mount ``meta`` (an index) at ``mount_point`` with no block yet."""
        from monarch_rdmafs.blockmount import BlockMount

        if self._mount is not None:
            raise RuntimeError(f"this FUSEActor already serves {self._mountpoint}")
        where = os.path.abspath(_resolve(mount_point))
        handler = self._handler
        # The fault callback runs on the mount's own thread: in this endpoint's context, so that
        # the call it makes is this actor's.
        here = contextvars.copy_context()

        def fault(block: int) -> None:
            if handler is not None:
                here.copy().run(lambda: handler.enqueue.broadcast(int(block)))

        self._mount = BlockMount(meta, meta["/"]["total_size"], where, fault)
        self._mountpoint = where

    @endpoint
    def refresh_mount(self, meta: dict) -> None:
        """Serve ``meta`` from now on, without unmounting."""
        if self._mount is None:
            raise RuntimeError("no active mount to refresh")
        self._mount.refresh(meta, meta["/"]["total_size"])

    @endpoint
    def cbc_listen(self, bind_addr: Optional[str] = None, via_gateway: bool = False) -> tuple[int, str]:
        """Open this worker's end of the chain; returns ``(linear rank, address)``."""
        from monarch.remotemount import _chain

        self._chain = _chain.serve(bind_addr)
        self._ctx = _chain.new_ctx(BLOCK_SIZE)
        return _linear_rank(), self._chain.addr

    @endpoint
    def cbc_start(self, addrs: list, num_streams: int = CBC_STREAMS) -> None:
        """Relay to the next worker of ``addrs`` (ordered by rank), this one's successor."""
        from monarch.remotemount import _chain

        if self._chain is None:
            raise RuntimeError("cbc_listen first")
        rank = _linear_rank()
        _chain.forward(self._chain, addrs[rank + 1] if rank + 1 < len(addrs) else None, self._ctx, num_streams)

    @endpoint
    def receive_via_cbcast(self, block_id: int, stale: list, nbytes: int) -> None:
        """Wait for block ``block_id``'s ``nbytes`` from the chain, put them in the mount, serve them."""
        from monarch.remotemount import _chain

        if self._mount is None:
            raise RuntimeError("receive_via_cbcast on a FUSEActor with no mount")
        addr = self._mount.block_ptr(int(block_id))
        _chain.ctx_wait_into(self._ctx, addr, BLOCK_SIZE, int(nbytes), _CHAIN_WAIT_MS)
        self._mount.receive_block(int(block_id), [str(p) for p in stale])

    @endpoint
    def mkdir(self, path: str) -> None:
        """Make the mount point (``$SUBDIR`` resolved)."""
        prepare_mount_point(_resolve(path))

    @endpoint
    def unmount(self, mount_point: str) -> tuple[str, str]:
        """Unmount ``mount_point``: ``("ok", "")``, ``("not_mounted", "")``, ``("busy", why)`` or ``("error", why)``."""
        from monarch_rdmafs.mount import is_mounted

        where = os.path.abspath(_resolve(mount_point))
        if self._mount is not None and self._mountpoint == where:
            m, self._mount, self._mountpoint = self._mount, None, None
            m.unmount()
            return ("ok", "") if not is_mounted(where) else ("error", f"{where} is still mounted")
        if not is_mounted(where):
            return "not_mounted", ""
        r = subprocess.run(["fusermount3", "-u", where], capture_output=True, text=True)
        if r.returncode == 0:
            return "ok", ""
        why = r.stderr.strip()
        return ("busy" if "busy" in why.lower() else "error"), why

    def __cleanup__(self, exc: Any = None) -> None:
        if self._mount is not None:
            self._mount.unmount()
            self._mount = None
        if self._chain is not None:
            self._chain.close()


class RemoteMountLeader(Actor):
    """One per mount, on the first worker: asks the owner for a block once however many workers
    miss it, and waits until every worker holds a block the owner sent."""

    def __init__(self, handler: Any = None):
        self._handler = handler
        self._asked: set[int] = set()
        self._workers: Any = None

    @endpoint
    def enqueue(self, block: int) -> None:
        """A worker misses ``block``: ask the owner, unless it was asked already."""
        b = int(block)
        if b in self._asked or self._handler is None:
            return
        self._asked.add(b)
        self._handler.enqueue.broadcast(b)

    @endpoint
    def clear_request(self, block: int) -> None:
        """The owner could not deliver ``block``: the next miss asks again."""
        self._asked.discard(int(block))

    @endpoint
    def set_fuse_actors(self, fuse_actors: Any) -> None:
        self._workers = fuse_actors

    @endpoint
    def await_block(self, block_id: int, stale: list, nbytes: int) -> None:
        """Return once every worker took block ``block_id`` off the chain and serves it."""
        if self._workers is None:
            raise RuntimeError("set_fuse_actors first")
        self._workers.receive_via_cbcast.call(int(block_id), list(stale), int(nbytes)).get()


class MountHandlerClient(Actor):
    """The owner of a mount (an actor in the client's process): builds the index, spawns the workers,
    and delivers the blocks they miss."""

    def __init__(self, host_mesh: Any, sourcepath: str, mntpoint: Optional[str] = None):
        self.host_mesh = host_mesh
        self.sourcepath = os.path.abspath(sourcepath)
        self.mntpoint = os.path.abspath(mntpoint) if mntpoint else self.sourcepath
        self.procs: Any = None
        self.fuse_actors: Any = None
        self.index: Optional[dict] = None
        self._leader: Any = None
        self._head: Any = None
        self._delivered: set[int] = set()
        self._buf = bytearray(BLOCK_SIZE)

    def _deliver(self, block: int) -> None:
        from monarch.remotemount import _chain

        if block in self._delivered:
            return
        assert self.index is not None and self._leader is not None and self._head is not None
        data, used, stale = materialise_block(self.index, block, self._buf)
        if stale:
            logger.warning("block %d: %d file(s) changed since the index and read EIO until a refresh: %s",
                           block, len(stale), stale)
        _chain.send_block(self._head, data, _SEND_CHUNK, block, used)
        self._leader.await_block.call_one(block, stale, used).get()
        self._delivered.add(block)

    @endpoint
    def enqueue(self, block: int) -> None:
        """A worker misses ``block``: deliver it to every worker (once)."""
        try:
            self._deliver(int(block))
        except Exception:
            logger.exception("delivering block %s failed", block)
            if self._leader is not None:
                self._leader.clear_request.broadcast(int(block))

    @endpoint
    def open(self, self_handle: Any, via_gateway: bool = False) -> None:
        """Spawn the workers, mount the index on each, wire the chain, send the small files' blocks."""
        from monarch.remotemount import _chain

        self._delivered.clear()
        self.procs = self.host_mesh.spawn_procs()
        self._leader = self.procs.flatten("rank").slice(rank=0).spawn("RemoteMountLeader", RemoteMountLeader, self_handle)
        self.fuse_actors = self.procs.spawn("FUSEActor", FUSEActor, self._leader)
        self.fuse_actors.mkdir.call(self.mntpoint).get()
        self.index = build_index(self.sourcepath, {})
        self._leader.set_fuse_actors.call_one(self.fuse_actors).get()
        listening = self.fuse_actors.cbc_listen.call(None, via_gateway).get()
        addrs = [addr for _rank, addr in sorted((v for _p, v in listening), key=lambda rv: rv[0])]
        self.fuse_actors.cbc_start.call(addrs, CBC_STREAMS).get()
        self._head = _chain.connect(addrs[0], CBC_STREAMS)
        self.fuse_actors.mount.call(self.mntpoint, self.index).get()
        for block in sorted(code_blocks(self.index)):
            self._deliver(block)

    @endpoint
    def close(self) -> None:
        """Unmount every worker's mount and stop the workers."""
        if self.fuse_actors is not None:
            answers = self.fuse_actors.unmount.call(self.mntpoint).get()
            bad = [f"{p}: {s}: {d}" for p, (s, d) in answers if s not in ("ok", "not_mounted")]
            procs, self.procs, self.fuse_actors = self.procs, None, None
            procs.stop().get()
            if bad:
                raise RuntimeError(f"failed to unmount {self.mntpoint!r}: {'; '.join(bad)}")
        self._leader = None
        self._head = None

    @endpoint
    def refresh(self) -> None:
        """Swap the source's current index into every mount (only when something changed)."""
        if self.fuse_actors is None:
            raise RuntimeError("no active mount to refresh; call open() first")
        assert self.index is not None
        new = build_index(self.sourcepath, self.index)
        if new == self.index:
            return
        self.index = new
        self.fuse_actors.refresh_mount.call(new).get()


class MountHandler:
    """The owner's handle that :func:`remotemount` returns: ``open()``, ``refresh()``, ``close()``."""

    def __init__(self, host_mesh: Any, sourcepath: str, mntpoint: Optional[str] = None):
        from monarch.actor import this_proc

        self.host_mesh = host_mesh
        self.sourcepath = sourcepath
        self.mntpoint = mntpoint
        # The owner actor runs in this process (Monarch's runs in a proc of this host): it reads the
        # source here, and no proc or host agent is started for it.
        self._client = this_proc().spawn("MountHandlerClient", MountHandlerClient, host_mesh,
                                                      sourcepath, mntpoint)

    def open(self, via_gateway: bool = False) -> None:
        """Mount on every host; returns once the small files are there (big ones come when read).

        ``ValueError`` if the mount point would hide the source on the machine that holds it."""
        _refuse_hiding_source(self.host_mesh, self.sourcepath, self.mntpoint)
        self._client.open.call_one(self._client, via_gateway).get()

    def close(self) -> None:
        """Unmount everywhere and stop the workers."""
        self._client.close.call_one().get()

    def refresh(self, sourcepath: Optional[str] = None) -> None:
        """Show the source as it is now, without unmounting (``sourcepath`` is accepted and unused)."""
        self._client.refresh.call_one().get()


def point_key(mesh: Any, index: int) -> str:
    """The coordinates of the ``index``-th host of ``mesh`` as ``$SUBDIR`` spells them (``hosts_0``; '' for none)."""
    shape = mesh._shape
    return "_".join(f"{k}_{v}" for k, v in shape.point(index).items()) if shape.labels else ""


def _refuse_hiding_source(host_mesh: Any, sourcepath: str, mntpoint: Optional[str]) -> None:
    """``ValueError`` if a host of ``host_mesh`` on this machine would mount over the source (or a
    folder above it): the mount would hide the files it is made of, and reading them would read
    the mount itself."""
    from monarch_agents.transport import is_same_host

    source = os.path.abspath(sourcepath)
    mnt = os.path.abspath(mntpoint) if mntpoint else source
    hosts = getattr(host_mesh, "hosts", None) or []
    for i, h in enumerate(hosts):
        addr = getattr(h, "addr", None)
        if addr is None or not is_same_host(addr):
            continue
        where = os.path.abspath(mnt.replace("$SUBDIR", point_key(host_mesh, i)))
        if where == source or source.startswith(where + os.sep):
            raise ValueError(f"mntpoint {where} would hide the source folder on this machine (host {h.host}); "
                             "give a mntpoint elsewhere, e.g. '/tmp/mnt/$SUBDIR'")


def remotemount(host_mesh: Any, sourcepath: str, mntpoint: Optional[str] = None) -> MountHandler:
    """Mount the local folder ``sourcepath`` read-only at ``mntpoint`` (default: the same path) on
    every host of ``host_mesh``; nothing happens until ``open()``."""
    return MountHandler(host_mesh, sourcepath, mntpoint)
