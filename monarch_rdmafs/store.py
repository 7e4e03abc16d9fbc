"""A host's chunk store: content-addressed files on local disk, so an unchanged chunk is never sent twice.

Layout under ``root``: ``chunks/<2 hex>/<id>`` (read-only files, written to
``tmp/`` and renamed in, so a reader or a killed writer never leaves half a
chunk), and ``tmp/`` (emptied by :meth:`ChunkStore.clean` when its writer starts).  A chunk is accepted
only if its bytes hash to its id, and checked again the first time this process reads it
(:meth:`ChunkStore.read_fd`, :meth:`ChunkStore.get`): what is on disk could have been changed since,
and the bytes served or materialized are what a command runs.  Nothing is made on disk before the first chunk is stored: a
host that never receives a workspace (most of them) leaves no folder behind, even if killed.

What it does not do: share chunks between users, or bound its size (``gc``
drops what no kept generation uses).
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import uuid

from monarch_rdmafs.errors import CorruptChunk, StoreFull
from monarch_rdmafs.manifest import chunk_id
from monarch_rdmafs.private import private_dir


_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class ChunkStore:
    """The chunks one host has, under ``root``."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._chunks = os.path.join(self.root, "chunks")
        self._tmp = os.path.join(self.root, "tmp")
        self._made = False
        # Chunks seen on disk: a chunk leaves only through gc, so a commit of 10,000 files does not stat them all.
        self._seen: set[str] = set()
        # Chunks this process has read back and found to hash to their id.
        self._verified: set[str] = set()

    def clean(self) -> None:
        """Remove what a killed writer left in ``tmp/`` (only the store's one writer calls this, at start)."""
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._made = False

    def _make(self) -> None:
        if not self._made:
            private_dir(self._chunks, top=self.root)
            private_dir(self._tmp, top=self.root)
            self._made = True

    def path(self, cid: str) -> str:
        if not is_chunk_id(cid):
            raise CorruptChunk(f"{cid[:40]!r} is not a chunk id")
        return os.path.join(self._chunks, cid[:2], cid)

    def has(self, cid: str) -> bool:
        if cid in self._seen:
            return True
        if not is_chunk_id(cid):
            return False
        if os.path.exists(self.path(cid)):
            self._seen.add(cid)
            return True
        return False

    def missing(self, ids) -> list[str]:
        """The ids of ``ids`` this store does not have, in order, without repeats."""
        return [c for c in dict.fromkeys(ids) if not self.has(c)]

    def put(self, cid: str, data: bytes | memoryview) -> bool:
        """Store ``data`` as ``cid``; False if it was already there.

        Raises CorruptChunk if the bytes do not hash to ``cid``, StoreFull if the disk is full.
        """
        if chunk_id(data) != cid:
            raise CorruptChunk(f"chunk {cid[:12]} arrived corrupted")
        final = self.path(cid)
        if os.path.exists(final):
            return False
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        try:
            self._make()
            os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
            os.replace(tmp, final)
            self._seen.add(cid)
            self._verified.add(cid)
        except OSError as e:
            _unlink(tmp)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull(f"no space left on the host's disk at {self.root}",
                                "free space there; the previous workspace generation is still served") from None
            raise
        return True

    def get(self, cid: str) -> bytes:
        """The bytes of ``cid``, checked against it; raises CorruptChunk if they do not hash to it."""
        fd = self._open(cid)
        try:
            data = _read_all(fd)
        finally:
            os.close(fd)
        self._check(cid, data)
        return data

    def read_fd(self, cid: str) -> int:
        """A read-only descriptor of ``cid`` (the caller closes it); its bytes are checked on the first open
        by this process.  Raises CorruptChunk if they do not hash to ``cid``, OSError if it is missing."""
        fd = self._open(cid)
        if cid not in self._verified:
            try:
                self._check(cid, _read_all(fd))
            except BaseException:
                os.close(fd)
                raise
        return fd

    def map(self, cid: str) -> "mmap.mmap | bytes":
        """``cid``'s bytes mapped read-only, populated (the kernel reads the file in large I/Os at once),
        checked against its hash the first time this process reads it.  b"" for an empty chunk.

        A chunk file is never written in place (it is renamed in whole), so the mapping stays the
        bytes that were checked.  Raises CorruptChunk, or OSError if it is missing."""
        fd = self._open(cid)
        try:
            size = os.fstat(fd).st_size
            data = mmap.mmap(fd, size, mmap.MAP_SHARED | _MAP_POPULATE, mmap.PROT_READ) if size else b""
        finally:
            os.close(fd)  # the mapping holds the file
        try:
            self._check(cid, data)
        except BaseException:
            if not isinstance(data, bytes):
                data.close()
            raise
        return data

    def _open(self, cid: str) -> int:
        # O_NOFOLLOW: a chunk is a plain file of ours, never a link to something else.
        return os.open(self.path(cid), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def _check(self, cid: str, data: bytes) -> None:
        if cid in self._verified:
            return
        if chunk_id(data) != cid:
            self.discard(cid)  # so the next sync sends it again
            raise CorruptChunk(f"chunk {cid[:12]} in the store at {self.root} does not match its hash",
                               "sync the workspace again (the chunk is replaced)")
        self._verified.add(cid)

    def discard(self, cid: str) -> None:
        """Remove a stored chunk found corrupt, so the next sync sends it again."""
        _unlink(self.path(cid))
        self._seen.discard(cid)
        self._verified.discard(cid)

    def gc(self, keep: set[str], older_than: float | None = None) -> int:
        """Remove every chunk not in ``keep`` (and, if given, stored before ``older_than``); returns how many."""
        removed = 0
        for d, name in self._files():
            if name in keep:
                continue
            p = os.path.join(d, name)
            try:
                if older_than is not None and os.stat(p).st_mtime >= older_than:
                    continue
            except OSError:
                continue
            _unlink(p)
            self._seen.discard(name)
            removed += 1
        return removed

    def statistics(self) -> dict:
        count = size = 0
        for d, name in self._files():
            count += 1
            try:
                size += os.stat(os.path.join(d, name)).st_size
            except OSError:
                pass
        return {"chunks": count, "bytes": size}

    def _files(self) -> list[tuple[str, str]]:
        """(folder, chunk id) of every stored chunk (none before the first was stored)."""
        out = []
        try:
            subs = os.listdir(self._chunks)
        except FileNotFoundError:
            return out
        for sub in subs:
            d = os.path.join(self._chunks, sub)
            out += [(d, name) for name in os.listdir(d)]
        return out


def is_chunk_id(cid: object) -> bool:
    """Whether ``cid`` is a chunk id as :func:`~monarch_rdmafs.manifest.chunk_id` makes them (32 lowercase hex)."""
    return type(cid) is str and len(cid) == 32 and all(c in "0123456789abcdef" for c in cid)


def _read_all(fd: int) -> bytes:
    parts = []
    pos = 0
    while True:
        b = os.pread(fd, 1 << 22, pos)
        if not b:
            return b"".join(parts)
        parts.append(b)
        pos += len(b)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
