"""A host's chunk store: content-addressed files on local disk, so an unchanged chunk is never sent twice.

Layout under ``root``: ``chunks/<2 hex>/<id>`` (read-only files, one per chunk), ``packs/<name>``
(read-only files holding many small chunks one after the other, and an index of them at the end:
see :meth:`ChunkStore.put_many`), and ``tmp/`` (emptied by :meth:`ChunkStore.clean` when its
writer starts).  Both kinds are written to ``tmp/`` and renamed in, so a reader or a killed writer
never leaves half a chunk.  Small chunks go in packs because creating a file is what storing a
small one costs (ext4 here: ~0.1-0.6 ms of kernel time each, more than writing 1 MiB): a workspace
of 10,000 source files is then a handful of files on each host, not 10,000.  A chunk is accepted
only if its bytes hash to its id, and checked again the first time this process reads it
(:meth:`ChunkStore.read_fd`, :meth:`ChunkStore.get`): what is on disk could have been changed since,
and the bytes served or materialized are what a command runs.  Nothing is made on disk before the first chunk is stored: a
host that never receives a workspace (most of them) leaves no folder behind, even if killed.

What it does not do: share chunks between users, or bound its size (``gc``
drops what no kept generation uses).
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import shutil
import struct
import threading
import uuid
from typing import Any, Iterable

from monarch_rdmafs.errors import CorruptChunk, StoreFull
from monarch_rdmafs.manifest import chunk_id
from monarch_rdmafs.private import private_dir


_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)

#: Chunks up to this size are stored in packs by :meth:`ChunkStore.put_many` (a file's chunks are 4 MiB
#: but its last, and a small file's only one): a big chunk keeps a file of its own, which a mount maps.
PACK_CHUNK_MAX = 256 << 10
#: A pack ends with its index: an entry per chunk (its id's 16 bytes, offset, length), then this footer.
_PACK_ENTRY = struct.Struct("<16sQQ")
_PACK_FOOTER = struct.Struct("<8sQ")  # magic, number of entries
_PACK_MAGIC = b"MRFSPAK1"
_IOV_MAX = 512
#: Chunks at least this big are written past the page cache (see ChunkStore._write_direct).
DIRECT_MIN = 1 << 20
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_ALIGN = 4096
_BOUNCE = 4 << 20
_local = threading.local()
#: Pack files kept open in a reading process (a mount reads many small files from a few packs).
_OPEN_PACKS = 64


class ChunkStore:
    """The chunks one host has, under ``root``."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._chunks = os.path.join(self.root, "chunks")
        self._packs = os.path.join(self.root, "packs")
        self._tmp = os.path.join(self.root, "tmp")
        self._made = False
        self._subdirs: set[str] = set()  # chunks/<2 hex> folders made by this process
        self._tmp_names = itertools.count()
        #: Whether big chunks are written with O_DIRECT (until the file system refuses it once).
        self._direct = bool(_O_DIRECT) and os.environ.get("MONARCH_RDMAFS_DIRECT", "1") != "0"
        # Chunks seen on disk: a chunk leaves only through gc, so a commit of 10,000 files does not stat them all.
        self._seen: set[str] = set()
        # Chunks this process has read back and found to hash to their id.
        self._verified: set[str] = set()
        # Packed chunks: id -> (pack name, offset, length); and each pack read so far -> its ids.
        self._packed: dict[str, tuple[str, int, int]] = {}
        self._pack_ids: dict[str, list[str]] = {}
        self._pack_files: dict[str, Any] = {}  # pack name -> open file (a reader holds it while it reads)
        self._lock = threading.Lock()  # the pack index: a mount reads on several threads

    def clean(self) -> None:
        """Remove what a killed writer left in ``tmp/`` (only the store's one writer calls this, at start)."""
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._made = False

    def _make(self) -> None:
        if not self._made:
            private_dir(self._chunks, top=self.root)
            private_dir(self._packs, top=self.root)
            private_dir(self._tmp, top=self.root)
            self._made = True

    def _tmp_path(self) -> str:
        # The store has one writer (its agent), and tmp/ is emptied when it starts: a counter is unique.
        return os.path.join(self._tmp, f"{os.getpid()}.{next(self._tmp_names)}")

    def path(self, cid: str) -> str:
        if not is_chunk_id(cid):
            raise CorruptChunk(f"{cid[:40]!r} is not a chunk id")
        return os.path.join(self._chunks, cid[:2], cid)

    def has(self, cid: str) -> bool:
        return self._has(cid, refresh=True)

    def _has(self, cid: str, refresh: bool) -> bool:
        if cid in self._seen:
            return True
        if not is_chunk_id(cid):
            return False
        if cid in self._packed or os.path.exists(self.path(cid)) or (refresh and self._load_packs() and cid in self._packed):
            self._seen.add(cid)
            return True
        return False

    def missing(self, ids) -> list[str]:
        """The ids of ``ids`` this store does not have, in order, without repeats."""
        self._load_packs()  # once for all of them
        return [c for c in dict.fromkeys(ids) if not self._has(c, refresh=False)]

    def put(self, cid: str, data: bytes | memoryview) -> bool:
        """Store ``data`` as ``cid``; False if it was already there.

        Raises CorruptChunk if the bytes do not hash to ``cid``, StoreFull if the disk is full.
        """
        if chunk_id(data) != cid:
            raise CorruptChunk(f"chunk {cid[:12]} arrived corrupted")
        final = self.path(cid)
        if cid in self._packed or os.path.exists(final):
            return False
        self._write_file(final, [data])
        self._seen.add(cid)
        self._verified.add(cid)
        return True

    def put_many(self, items: Iterable[tuple[str, Any]]) -> tuple[int, int, list[str]]:
        """Store the chunks of ``items`` (id, bytes-like) this store lacks; (how many stored, their bytes, corrupt ids).

        Each is checked against its id first (a corrupt one is listed, not stored).  Chunks of at
        most :data:`PACK_CHUNK_MAX` bytes go together into one new pack, renamed in whole; bigger
        ones each into a file of its own.  Raises StoreFull if the disk is full.
        """
        small: list[tuple[str, Any]] = []
        taken: set[str] = set()
        corrupt: list[str] = []
        stored = size = 0
        self._load_packs()
        for cid, data in items:
            if cid in taken or not is_chunk_id(cid) or self._has(cid, refresh=False):
                continue
            if chunk_id(data) != cid:
                corrupt.append(cid)
                continue
            taken.add(cid)
            if len(data) <= PACK_CHUNK_MAX:
                small.append((cid, data))
                continue
            self._write_file(self.path(cid), [data])
            self._seen.add(cid)
            self._verified.add(cid)
            stored += 1
            size += len(data)
        if small:
            entries, pos = [], 0
            for cid, data in small:
                entries.append((cid, pos, len(data)))
                pos += len(data)
            index = b"".join(_PACK_ENTRY.pack(bytes.fromhex(c), o, n) for c, o, n in entries)
            name = uuid.uuid4().hex
            self._write_file(os.path.join(self._packs, name),
                             [d for _, d in small] + [index + _PACK_FOOTER.pack(_PACK_MAGIC, len(entries))], subdir=False)
            self._add_pack(name, entries)
            self._verified.update(taken)
            stored += len(small)
            size += pos
        return stored, size, corrupt

    def _write_file(self, final: str, parts: list, subdir: bool = True) -> None:
        """``parts`` written one after the other to a new read-only file, renamed in at ``final``."""
        tmp = self._tmp_path()
        try:
            self._make()
            folder = os.path.dirname(final)
            if subdir and folder not in self._subdirs:
                os.makedirs(folder, mode=0o700, exist_ok=True)
                self._subdirs.add(folder)
            views = [memoryview(p).cast("B") for p in parts if len(p)]
            if len(views) == 1 and views[0].nbytes >= DIRECT_MIN and self._direct and self._write_direct(tmp, views[0]):
                views = []
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o400) if views else -1
            try:
                while views:
                    n = os.writev(fd, views[:_IOV_MAX])
                    while views and n >= views[0].nbytes:
                        n -= views[0].nbytes
                        views.pop(0)
                    if n:
                        views[0] = views[0][n:]
            finally:
                if fd >= 0:
                    os.close(fd)
            os.replace(tmp, final)
        except OSError as e:
            _unlink(tmp)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull(f"no space left on the host's disk at {self.root}",
                                "free space there; the previous workspace generation is still served") from None
            raise

    def _write_direct(self, tmp: str, data: memoryview) -> bool:
        """Write ``data`` to the new file ``tmp`` past the page cache (O_DIRECT); False where the file
        system refuses that (nothing is left at ``tmp`` then: the caller writes it the usual way).

        A big chunk is written this way because copying it into the page cache costs more than the
        disk does: fresh page-cache pages are the dearest memory of a virtual machine (here ~0.35-2 GB/s
        for a buffered write of new files, 10x less than copying into memory already in use, against
        ~2 GB/s for the disk with no CPU at all).  The bytes go through an aligned buffer of this
        thread's (reused, so its pages are warm); a last partial block is padded, then cut off.
        """
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW | _O_DIRECT, 0o400)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self._direct = False
            return False
        n = data.nbytes
        try:
            bounce = getattr(_local, "bounce", None)
            if bounce is None:
                bounce = _local.bounce = mmap.mmap(-1, _BOUNCE)
            pos = 0
            while pos < n:
                k = min(_BOUNCE, n - pos)
                bounce[:k] = data[pos:pos + k]
                padded = -(-k // _ALIGN) * _ALIGN
                if padded > k:
                    bounce[k:padded] = bytes(padded - k)
                done = 0
                view = memoryview(bounce)
                try:
                    while done < padded:
                        done += os.write(fd, view[done:padded])
                finally:
                    view.release()
                pos += k
            if n % _ALIGN:
                os.ftruncate(fd, n)
        except OSError as e:
            os.close(fd)
            _unlink(tmp)
            if e.errno != errno.EINVAL:
                raise
            self._direct = False
            return False
        os.close(fd)
        return True

    # -- packs --------------------------------------------------------------------

    def _add_pack(self, name: str, entries: list[tuple[str, int, int]]) -> None:
        with self._lock:
            self._pack_ids[name] = [cid for cid, _, _ in entries]
            for cid, off, n in entries:
                self._packed.setdefault(cid, (name, off, n))
                self._seen.add(cid)

    def _load_packs(self) -> bool:
        """Read the index of every pack not read yet (another process may have added some); True if any.

        Packs gone from the folder are forgotten: a mount process that found one corrupt removed it,
        and this store (the agent's) must then say its chunks are missing, so that they are sent again."""
        try:
            names = os.listdir(self._packs)
        except FileNotFoundError:
            names = []
        for gone in set(self._pack_ids).difference(names):
            self._forget_pack(gone)
        added = False
        for name in names:
            if name in self._pack_ids:
                continue
            entries = self._read_index(name)
            if entries is not None:
                self._add_pack(name, entries)
                added = True
        return added

    def _read_index(self, name: str) -> list[tuple[str, int, int]] | None:
        """A pack's (id, offset, length) entries, each within the file; None for a file that is not a pack."""
        try:
            fd = os.open(os.path.join(self._packs, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < _PACK_FOOTER.size:
                return None
            magic, count = _PACK_FOOTER.unpack(os.pread(fd, _PACK_FOOTER.size, size - _PACK_FOOTER.size))
            end = size - _PACK_FOOTER.size - count * _PACK_ENTRY.size
            if magic != _PACK_MAGIC or end < 0:
                return None
            raw = os.pread(fd, count * _PACK_ENTRY.size, end)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(raw) != count * _PACK_ENTRY.size:
            return None
        out = []
        for digest, off, n in _PACK_ENTRY.iter_unpack(raw):
            if off + n > end:
                return None  # an index that points outside the chunks: not trusted at all
            out.append((digest.hex(), off, n))
        return out

    def _pack_file(self, name: str) -> Any:
        with self._lock:
            f = self._pack_files.get(name)
            if f is None:
                # A file object, not a bare descriptor: a thread still reading keeps it open if it is dropped.
                fd = os.open(os.path.join(self._packs, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                f = self._pack_files[name] = os.fdopen(fd, "rb", buffering=0)
                while len(self._pack_files) > _OPEN_PACKS:
                    del self._pack_files[next(iter(self._pack_files))]
            return f

    def _open_any(self, cid: str) -> tuple[int, bytes | None]:
        """(a descriptor of ``cid``'s file, None), or (-1, its bytes) if it is packed; not checked yet.

        Raises OSError if it is in neither.  The packs folder is listed again (packs another process
        added since) only when there is no file: a mount reading big chunks never lists it."""
        if cid in self._packed:
            data = self._read_packed(cid)
            if data is not None:
                return -1, data
        try:
            return self._open(cid), None
        except FileNotFoundError:
            data = self._read_packed(cid) if self._load_packs() else None
            if data is None:
                raise
            return -1, data

    def _read_packed(self, cid: str) -> bytes | None:
        """``cid``'s bytes from its pack (not checked yet), or None if it is in none."""
        where = self._packed.get(cid)
        if where is None:
            return None
        name, off, n = where
        try:
            f = self._pack_file(name)
        except FileNotFoundError:
            return None  # removed meanwhile: the chunk file, if any, answers
        data = os.pread(f.fileno(), n, off)
        if len(data) != n:
            return b""  # cut short: fails the check
        return data

    def get(self, cid: str) -> bytes:
        """The bytes of ``cid``, checked against it; raises CorruptChunk if they do not hash to it."""
        fd, packed = self._open_any(cid)
        if packed is not None:
            self._check(cid, packed)
            return packed
        try:
            data = _read_all(fd)
        finally:
            os.close(fd)
        self._check(cid, data)
        return data

    def read_fd(self, cid: str) -> int:
        """A read-only descriptor of ``cid`` (the caller closes it); its bytes are checked on the first open
        by this process.  Raises CorruptChunk if they do not hash to ``cid``, OSError if it is missing.
        A packed chunk's descriptor is a copy of its bytes (a memory file)."""
        fd, packed = self._open_any(cid)
        if packed is not None:
            self._check(cid, packed)
            fd = os.memfd_create("chunk", os.MFD_CLOEXEC)
            try:
                view = memoryview(packed)
                while view:
                    view = view[os.write(fd, view):]
                os.lseek(fd, 0, os.SEEK_SET)
            except BaseException:
                os.close(fd)  # (out of memory) the caller gets the error, not a descriptor to leak
                raise
            return fd
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
        bytes that were checked.  A packed chunk (a small one) is read into ``bytes`` instead.
        Raises CorruptChunk, or OSError if it is missing."""
        fd, packed = self._open_any(cid)
        if packed is not None:
            self._check(cid, packed)
            return packed
        try:
            size = os.fstat(fd).st_size
            if size:
                # The whole file asked for first: the kernel reads it in large requests; populating the
                # mapping alone reads around each fault.  Cold 4 MiB chunk files, 4 threads: ~0.8-0.96 ->
                # ~1.0-1.24 GB/s here.
                try:
                    os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
                except OSError:
                    pass
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
        """Remove a stored chunk found corrupt, so the next sync sends it again (a pack goes whole:
        the rest of it is sent again too)."""
        where = self._packed.get(cid)
        if where is not None:
            self._drop_pack(where[0])
        _unlink(self.path(cid))
        self._seen.discard(cid)
        self._verified.discard(cid)

    def _drop_pack(self, name: str) -> int:
        _unlink(os.path.join(self._packs, name))
        return self._forget_pack(name)

    def _forget_pack(self, name: str) -> int:
        with self._lock:
            ids = self._pack_ids.pop(name, [])
            self._pack_files.pop(name, None)
            for c in ids:
                if self._packed.get(c, ("",))[0] == name:
                    del self._packed[c]
                    self._seen.discard(c)
                    self._verified.discard(c)
        return len(ids)

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
        self._load_packs()
        for name, ids in list(self._pack_ids.items()):
            if any(c in keep for c in ids):
                continue  # a pack goes only once none of its chunks is used
            try:
                if older_than is not None and os.stat(os.path.join(self._packs, name)).st_mtime >= older_than:
                    continue
            except OSError:
                pass
            removed += self._drop_pack(name)
        return removed

    def statistics(self) -> dict:
        count = size = 0
        for d, name in self._files():
            count += 1
            try:
                size += os.stat(os.path.join(d, name)).st_size
            except OSError:
                pass
        self._load_packs()
        with self._lock:
            count += len(self._packed)
            size += sum(n for _, _, n in self._packed.values())
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
