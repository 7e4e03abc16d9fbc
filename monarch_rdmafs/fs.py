"""The read-only FUSE filesystem a host serves a synced tree through, reading from its chunk store.

A generation switch is one assignment: a lookup, a readdir or an open sees the
old tree or the new one, never a mix.  A file that was open keeps reading the
bytes it was opened with.  Inode numbers are content identities (a directory's
is its path; a file's or link's is its path plus everything a reader can see of
it), so the kernel's page cache for an inode is never stale: ``keep_cache`` is
always on, and a switch only invalidates the directory entries that changed.

What it does not do: writes of any kind (EROFS), hard links, xattrs, or forget
old inodes (one small record per version of a file, for the mount's life).
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
from collections import OrderedDict
from typing import Any, Callable

import pyfuse3
import trio

from monarch_rdmafs.errors import CorruptChunk
from monarch_rdmafs.manifest import CHUNK_SIZE, DIR, FILE, LINK, Entry, Manifest, parent_of
from monarch_rdmafs.store import ChunkStore

log = logging.getLogger("monarch.rdmafs.fs")

#: The kernel keeps names and attributes this long: every change is invalidated explicitly at a switch.
_CACHE_TIMEOUT_S = 3600.0
#: Chunks kept mapped (each holds a descriptor; its pages are the page cache's, not this process's).
_MAX_OPEN_CHUNKS = 64
#: Chunks read ahead of the one being read, per open file: the disk reads them (mapped and checked on
#: threads) while this process serves the one before.
_AHEAD_CHUNKS = 3
#: Threads mapping and checking chunks at once (each has the kernel read a whole chunk).
_OPENERS = 4
#: Chunks after those that the kernel is asked to start reading (posix_fadvise, no thread).
_HINTED_CHUNKS = 8
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class Generation:
    """One manifest, indexed for lookups: entries by path, and each directory's sorted names."""

    def __init__(self, manifest: Manifest):
        self.id = manifest.id
        self.manifest = manifest
        self.by_path: dict[str, Entry] = manifest.by_path()
        self.children: dict[str, list[str]] = {e.path: [] for e in manifest.entries if e.kind == DIR}
        for e in manifest.entries:
            if e.path:
                parent, name = parent_of(e.path)
                self.children.setdefault(parent, []).append(name)


class WorkspaceFS(pyfuse3.Operations):
    """Serves one tree at a time from ``store``; :meth:`switch` moves to a new manifest."""

    enable_writeback_cache = False

    def __init__(self, store: ChunkStore, manifest: Manifest):
        super().__init__()
        self.store = store
        self.gen = Generation(manifest)
        self._ino_by_key: dict[tuple, int] = {("d", ""): pyfuse3.ROOT_INODE}
        self._nodes: dict[int, tuple[str, Entry]] = {pyfuse3.ROOT_INODE: ("", self.gen.by_path[""])}
        self._next_ino = itertools.count(pyfuse3.ROOT_INODE + 1)
        self._handles: dict[int, Entry] = {}
        self._listing_gen: dict[int, Generation] = {}
        self._next_fh = itertools.count(1)
        #: Chunks mapped and checked, served from their mappings: no copy out of the page cache here,
        #: pyfuse3 replies from the mapping itself.
        self._maps: OrderedDict[str, Any] = OrderedDict()
        #: Chunks being mapped and checked on a thread, and what says when that is done.
        self._opening: dict[str, trio.Event] = {}
        self._openers: trio.CapacityLimiter | None = None
        #: The last chunk read ahead, per open file; chunks the kernel was told to read (a bounded memory).
        self._ahead: dict[int, int] = {}
        self._hinted: dict[str, None] = {}
        #: Called once, at the first open (the mount sets the kernel's read-ahead there).
        self.first_open: Callable[[], None] | None = None

    # -- generations -----------------------------------------------------------

    def switch(self, manifest: Manifest) -> list[tuple[int, bytes]]:
        """Serve ``manifest`` from now on; returns the (parent inode, name) entries the kernel must forget."""
        old = self.gen
        new = Generation(manifest)
        self.gen = new  # the switch: everything after this line sees the new tree
        stale = []
        for path in old.by_path.keys() | new.by_path.keys():
            if not path:
                continue
            a, b = old.by_path.get(path), new.by_path.get(path)
            if a is not None and b is not None and a.identity == b.identity:
                continue
            if a is not None and b is not None and a.kind == b.kind == DIR:
                self._refresh_dir(path, b)
                continue
            parent, name = parent_of(path)
            ino = self._ino_by_key.get(("d", parent))
            if ino is not None and parent in old.by_path:
                stale.append((ino, os.fsencode(name)))
        self._refresh_dir("", new.by_path[""])
        return stale

    def _refresh_dir(self, path: str, entry: Entry) -> None:
        ino = self._ino_by_key.get(("d", path))
        if ino is not None:
            self._nodes[ino] = (path, entry)

    def _ino(self, path: str, entry: Entry) -> int:
        key = ("d", path) if entry.kind == DIR else (path, entry.identity)
        ino = self._ino_by_key.get(key)
        if ino is None:
            ino = next(self._next_ino)
            self._ino_by_key[key] = ino
        self._nodes[ino] = (path, entry)
        return ino

    def _node(self, ino: int) -> tuple[str, Entry]:
        try:
            return self._nodes[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _attrs(self, ino: int, entry: Entry) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.generation = 0
        a.entry_timeout = _CACHE_TIMEOUT_S
        a.attr_timeout = _CACHE_TIMEOUT_S
        a.st_mode = entry.st_mode
        a.st_nlink = 2 if entry.kind == DIR else 1
        a.st_uid = os.getuid()
        a.st_gid = os.getgid()
        a.st_rdev = 0
        a.st_size = entry.size
        a.st_blksize = 1 << 17
        a.st_blocks = (entry.size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = entry.mtime_ns
        return a

    # -- lookups -----------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        parent, _ = self._node(parent_inode)
        name_s = os.fsdecode(name)
        if name_s == ".":
            path = parent
        elif name_s == "..":
            path = parent_of(parent)[0]
        else:
            path = f"{parent}/{name_s}" if parent else name_s
        entry = self.gen.by_path.get(path)
        if entry is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(self._ino(path, entry), entry)

    async def getattr(self, inode: int, ctx=None) -> pyfuse3.EntryAttributes:
        _, entry = self._node(inode)
        return self._attrs(inode, entry)

    async def readlink(self, inode: int, ctx=None) -> bytes:
        _, entry = self._node(inode)
        if entry.kind != LINK:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(entry.target)

    async def opendir(self, inode: int, ctx=None) -> int:
        path, entry = self._node(inode)
        if entry.kind != DIR:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        gen = self.gen
        if path not in gen.children:
            raise pyfuse3.FUSEError(errno.ENOENT)
        fh = next(self._next_fh)
        # The listing is taken now, from one generation, so a switch mid-listing cannot mix trees.
        self._handles[fh] = Entry(path, DIR, 0, 0, 0, tuple(gen.children[path]))
        self._listing_gen[fh] = gen
        return fh

    async def readdir(self, fh: int, start_id: int, token) -> None:
        listing = self._handles.get(fh)
        gen = self._listing_gen.get(fh)
        if listing is None or gen is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        base = listing.path
        names = listing.chunks
        for i in range(start_id, len(names)):
            path = f"{base}/{names[i]}" if base else names[i]
            entry = gen.by_path[path]
            if not pyfuse3.readdir_reply(token, os.fsencode(names[i]), self._attrs(self._ino(path, entry), entry), i + 1):
                return

    async def releasedir(self, fh: int) -> None:
        self._handles.pop(fh, None)
        self._listing_gen.pop(fh, None)

    # -- files -------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx=None) -> pyfuse3.FileInfo:
        _, entry = self._node(inode)
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if entry.kind != FILE:
            raise pyfuse3.FUSEError(errno.EISDIR if entry.kind == DIR else errno.EINVAL)
        if self.first_open is not None:
            first, self.first_open = self.first_open, None
            first()
        fh = next(self._next_fh)
        self._handles[fh] = entry
        self._read_ahead(fh, entry, 0)  # the disk starts before the first read asks
        # An inode's bytes never change (a changed file gets a new inode), so the page cache stays valid.
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        entry = self._handles.get(fh)
        if entry is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        end = min(off + size, entry.size)
        if off < end:
            self._read_ahead(fh, entry, off // CHUNK_SIZE)
        parts: list = []
        pos = off
        while pos < end:
            idx, within = divmod(pos, CHUNK_SIZE)
            n = min(end - pos, CHUNK_SIZE - within)
            cid = entry.chunks[idx]
            mapped = self._maps.get(cid)
            if mapped is None:
                mapped = await self._chunk_async(cid)
            else:
                self._maps.move_to_end(cid)
            data = memoryview(mapped)[within:within + n]  # pyfuse3 replies from any buffer
            if len(data) != n:
                log.error("chunk %s of %s is short", cid, entry.path)
                raise pyfuse3.FUSEError(errno.EIO)
            parts.append(data)
            pos += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def release(self, fh: int) -> None:
        self._handles.pop(fh, None)
        self._ahead.pop(fh, None)

    def _read_ahead(self, fh: int, entry: Entry, idx: int) -> None:
        """On entering a chunk, have the next ``_AHEAD_CHUNKS`` opened, read whole and checked on threads,
        while this one is served: the disk works beside the loop, never between two of its replies."""
        last = min(idx + _AHEAD_CHUNKS, len(entry.chunks) - 1)
        if self._ahead.get(fh, -1) >= last:
            return
        self._ahead[fh] = last
        for i in range(idx, last + 1):
            cid = entry.chunks[i]
            if cid not in self._maps and cid not in self._opening:
                trio.lowlevel.spawn_system_task(self._open_chunk, cid)
        # Further on, only a hint: the kernel starts reading those chunk files now (no thread waits on
        # them), so the disk has several requests in flight (a chunk file is read in one request else):
        # 0.96 -> 1.2 GB/s reading 48 cold chunk files here.  Given on a thread: posix_fadvise queues
        # the reads itself and waits when the disk's queue is full (~10% of this loop's time, on it).
        hints = []
        for i in range(last + 1, min(last + 1 + _HINTED_CHUNKS, len(entry.chunks))):
            cid = entry.chunks[i]
            if cid not in self._maps and cid not in self._opening and cid not in self._hinted:
                self._hinted[cid] = None
                if len(self._hinted) > 4 * _MAX_OPEN_CHUNKS:
                    del self._hinted[next(iter(self._hinted))]
                hints.append(cid)
        if hints:
            trio.lowlevel.spawn_system_task(self._hint, hints)

    async def _hint(self, cids: list[str]) -> None:
        try:
            await trio.to_thread.run_sync(self._hint_now, cids)
        except Exception:  # a background task must not end the loop
            log.exception("read-ahead hint")

    def _hint_now(self, cids: list[str]) -> None:
        for cid in cids:
            try:
                fd = os.open(self.store.path(cid), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except (OSError, CorruptChunk):
                continue  # packed, or the read that needs it says what is wrong
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    async def _chunk_async(self, cid: str) -> Any:
        """``cid`` mapped and checked on a thread (the loop serves other reads meanwhile)."""
        done = self._opening.get(cid)
        if done is not None:
            await done.wait()
        else:
            await self._open_chunk(cid)
        mapped = self._maps.get(cid)
        if mapped is None:  # the open failed, and said why in the log
            raise pyfuse3.FUSEError(errno.EIO)
        return mapped

    async def _open_chunk(self, cid: str) -> None:
        """Map ``cid`` on a thread (the kernel reads it whole), check its hash there the first time, keep it.

        Also a background task (read-ahead): it raises nothing, a failure is logged and the read
        that needs the chunk answers EIO."""
        if cid in self._opening or cid in self._maps:
            return
        done = self._opening[cid] = trio.Event()
        try:
            if self._openers is None:
                self._openers = trio.CapacityLimiter(_OPENERS)
            mapped = await trio.to_thread.run_sync(self.store.map, cid, limiter=self._openers)
        except CorruptChunk as e:
            log.error("%s", e)
        except OSError as e:
            log.error("chunk %s missing from the store: %s", cid, e)
        except Exception:  # a background task must not end the loop (trio.Cancelled still goes through)
            log.exception("opening chunk %s", cid)
        else:
            self._maps[cid] = mapped
            while len(self._maps) > _MAX_OPEN_CHUNKS:
                # Dropped, not closed: a reply in flight may still read it; the last reference unmaps it.
                self._maps.popitem(last=False)
        finally:
            del self._opening[cid]
            done.set()

    async def access(self, inode: int, mode: int, ctx=None) -> bool:
        if mode & os.W_OK:
            raise pyfuse3.FUSEError(errno.EROFS)
        return True

    async def statfs(self, ctx=None) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        total = self.gen.manifest.total_bytes
        s.f_blocks = (total + 4095) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = len(self.gen.by_path)
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    def close_files(self) -> None:
        self._maps.clear()
