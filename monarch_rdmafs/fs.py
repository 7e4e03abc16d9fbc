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
import mmap
import os
from collections import OrderedDict, deque
from typing import Any, Callable

import pyfuse3
import trio

from monarch_rdmafs.errors import CorruptChunk
from monarch_rdmafs.manifest import CHUNK_SIZE, DIR, FILE, LINK, Entry, Manifest, parent_of
from monarch_rdmafs.store import ChunkStore, ReadStream

log = logging.getLogger("monarch.rdmafs.fs")

#: The kernel keeps names and attributes this long: every change is invalidated explicitly at a switch.
_CACHE_TIMEOUT_S = 3600.0
#: Chunks kept read in this process's buffers (CHUNK_SIZE each: up to 64 MiB of this process's memory
#: while it reads; reused, not given back).
_MAX_OPEN_CHUNKS = 16
#: Chunks read ahead of the one being read, per open file: read in order and checked on a thread while
#: this process serves the ones before (as many as the kernel asks ahead, and four more).
_AHEAD_CHUNKS = 8
#: Threads reading and checking chunks at once: requests the disk has in flight.
_OPENERS = 4
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


class _Stream:
    """One open file's chunks read ahead in its order, one at a time, through one :class:`ReadStream`:
    a file's big chunks lie one after another in a segment, so this is a read of that file in order,
    and the kernel reads ahead of it in large requests."""

    def __init__(self) -> None:
        self.todo: deque[str] = deque()
        self.files = ReadStream()
        self.running = False
        self.released = False


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
        #: Chunks read and checked: cid -> (this process's buffer holding it, or None for a packed chunk's
        #: bytes; its bytes).  pyfuse3 replies from the buffer itself.
        self._maps: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        #: Buffers of evicted chunks, reused: a warm buffer costs no page faults (fresh pages are dear here).
        self._free: list[mmap.mmap] = []
        #: Chunks a read in progress holds (it awaits another chunk): not evicted until it replied.
        self._pinned: dict[str, int] = {}
        #: Chunks being read and checked on a thread, and what says when that is done.
        self._opening: dict[str, trio.Event] = {}
        self._openers: trio.CapacityLimiter | None = None
        #: Chunks whose last read failed (said in the log): a read waiting on one answers EIO.
        self._failed: set[str] = set()
        #: The last chunk read ahead, and the reader of its chunks in order, per open file.
        self._ahead: dict[int, int] = {}
        self._streams: dict[int, _Stream] = {}
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
        pinned: list[str] = []
        pos = off
        try:
            while pos < end:
                idx, within = divmod(pos, CHUNK_SIZE)
                n = min(end - pos, CHUNK_SIZE - within)
                cid = entry.chunks[idx]
                held = self._maps.get(cid)
                if held is None:
                    held = await self._chunk_async(cid)
                else:
                    self._maps.move_to_end(cid)
                # Held until this reply is made (a later chunk's wait must not let its buffer be reused).
                self._pinned[cid] = self._pinned.get(cid, 0) + 1
                pinned.append(cid)
                data = memoryview(held[1])[within:within + n]  # pyfuse3 replies from any buffer
                if len(data) != n:
                    log.error("chunk %s of %s is short", cid, entry.path)
                    raise pyfuse3.FUSEError(errno.EIO)
                parts.append(data)
                pos += n
            # pyfuse3 replies as soon as this returns, with no wait between: the buffers are not reused before.
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            for cid in pinned:
                left = self._pinned[cid] - 1
                if left:
                    self._pinned[cid] = left
                else:
                    del self._pinned[cid]

    async def release(self, fh: int) -> None:
        self._handles.pop(fh, None)
        self._ahead.pop(fh, None)
        stream = self._streams.pop(fh, None)
        if stream is not None:
            stream.released = True
            if not stream.running:
                stream.files.close()

    def _read_ahead(self, fh: int, entry: Entry, idx: int) -> None:
        """On entering a chunk, have it and the next ``_AHEAD_CHUNKS`` read whole and checked on threads,
        while this one is served: the disk works beside the loop, never between two of its replies,
        with up to ``_OPENERS`` requests of a whole chunk in flight."""
        last = min(idx + _AHEAD_CHUNKS, len(entry.chunks) - 1)
        if self._ahead.get(fh, -1) >= last:
            return
        self._ahead[fh] = last
        stream = self._streams.get(fh)
        if stream is None:
            stream = self._streams[fh] = _Stream()
        for i in range(idx, last + 1):
            cid = entry.chunks[i]
            if cid not in self._maps and cid not in self._opening:
                self._opening[cid] = trio.Event()  # claimed: a read that needs it waits for the stream
                stream.todo.append(cid)
        if stream.todo and not stream.running:
            stream.running = True
            trio.lowlevel.spawn_system_task(self._stream_chunks, stream)

    async def _stream_chunks(self, stream: _Stream) -> None:
        try:
            while stream.todo:
                await self._open_chunk(stream.todo.popleft(), stream.files, claimed=True)
        finally:
            stream.running = False
            if stream.released:
                stream.files.close()

    async def _chunk_async(self, cid: str) -> tuple[Any, Any]:
        """``cid`` read and checked on a thread (the loop serves other reads meanwhile)."""
        for _ in range(3):
            done = self._opening.get(cid)
            if done is not None:
                await done.wait()
            else:
                await self._open_chunk(cid)
            held = self._maps.get(cid)
            if held is not None:
                self._maps.move_to_end(cid)
                return held
            if cid in self._failed:
                break  # the read failed, and said why in the log
            # Read, then evicted by other reads finishing before this one woke: read again.
        raise pyfuse3.FUSEError(errno.EIO)

    async def _open_chunk(self, cid: str, files: ReadStream | None = None, claimed: bool = False) -> None:
        """Read ``cid`` whole on a thread into a buffer of this process's, check its hash there, keep it.
        ``claimed``: its event is in ``_opening`` already (a stream's); ``files``: that stream's.

        Also a background task (read-ahead): it raises nothing, a failure is logged and the read
        that needs the chunk answers EIO."""
        if not claimed:
            if cid in self._opening or cid in self._maps:
                return
            self._opening[cid] = trio.Event()
        done = self._opening[cid]
        self._failed.discard(cid)
        buf = self._free.pop() if self._free else None
        try:
            if self._openers is None:
                self._openers = trio.CapacityLimiter(_OPENERS)
            if buf is None:
                buf = mmap.mmap(-1, CHUNK_SIZE)  # page-aligned, as O_DIRECT wants
            data = await trio.to_thread.run_sync(self.store.read_into, cid, buf, files, limiter=self._openers)
        except CorruptChunk as e:
            self._failed.add(cid)
            log.error("%s", e)
        except OSError as e:
            self._failed.add(cid)
            log.error("chunk %s missing from the store: %s", cid, e)
        except Exception:  # a background task must not end the loop (trio.Cancelled still goes through)
            self._failed.add(cid)
            log.exception("opening chunk %s", cid)
        else:
            if isinstance(data, memoryview):
                self._maps[cid] = (buf, data)
                buf = None
            else:
                self._maps[cid] = (None, data)  # a packed chunk's own bytes
            self._evict()
        finally:
            if buf is not None:
                self._free.append(buf)
            del self._opening[cid]
            done.set()

    def _evict(self) -> None:
        """Drop the least recently read chunks past ``_MAX_OPEN_CHUNKS`` (not those a read holds); their
        buffers are reused.  Only on this loop, never while a reply is being made from one."""
        over = len(self._maps) - _MAX_OPEN_CHUNKS
        if over <= 0:
            return
        for cid in [c for c in self._maps if c not in self._pinned][:over]:
            buf, data = self._maps.pop(cid)
            if buf is not None:
                if len(self._free) < _MAX_OPEN_CHUNKS:
                    self._free.append(buf)

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
        for stream in self._streams.values():
            if not stream.running:
                stream.files.close()
        self._streams.clear()
        self._maps.clear()
        self._free.clear()
