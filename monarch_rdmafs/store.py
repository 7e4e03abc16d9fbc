"""A host's chunk store: content-addressed files on local disk, so an unchanged chunk is never sent twice.

Layout under ``root``:

- ``segs/<name>``: big chunks (over :data:`PACK_CHUNK_MAX`) appended one after another in the order
  they arrive (a file's chunks in its order), each at a 4 KiB boundary, up to :data:`SEGMENT_MAX`
  a segment; ``segs/<name>.idx`` an entry per chunk (id, offset, length), appended only once its
  bytes are written; ``segs/<name>.bad`` the chunks found corrupt there (id and offset, appended by
  whichever process found them).  The one writer (the host's agent) appends to one segment at a
  time.  So reading a big file is reading one store file in order, which the kernel reads ahead
  in large requests: a mount's first read of 384 MiB-1 GiB of shards here (under ``chrt``, the store's
  files not in the page cache) went from ~0.5-0.9 GB/s with a file per chunk to ~2.0-2.7 GB/s.
- ``packs/<name>``: many small chunks one after the other and an index of them at the end (see
  :meth:`ChunkStore.put_many`), written to ``tmp/`` and renamed in whole.  Small chunks go in packs
  because creating a file is what storing a small one costs (ext4 here: ~0.1-0.6 ms of kernel time
  each, more than writing 1 MiB): 10,000 source files are a handful of files on each host.
- ``chunks/<2 hex>/<id>``: a chunk as a file of its own (:meth:`ChunkStore.put`: a manifest; and big
  chunks of stores written before segments, still read).
- ``tmp/``: emptied by :meth:`ChunkStore.clean` when its writer starts.

No reader ever finds half a chunk named: a pack or file is renamed in whole, a segment's entry is
written after its bytes, and an entry that points past its segment's end (cut short) is not
trusted.  A chunk is accepted only if its bytes hash to its id, and checked again when read back
(:meth:`ChunkStore.read_into`, a mount's path: on every read; :meth:`ChunkStore.get`: the first time
this process reads it): what is on disk could have been changed since, and the bytes served or
materialized are what a command runs.  A corrupt chunk is an error, never its bytes, and leaves
the store (a pack whole, a file, or a segment's entry through its bad list), so that every process
(the agent's store included) finds it missing and the next sync sends it again.  Nothing is made
on disk before the first chunk is stored: a host that never receives a workspace (most of them)
leaves no folder behind, even if killed.

What it does not do: share chunks between users, bound its size (``gc`` drops what no kept
generation uses: a pack or segment only once none of its chunks is used), or compact a segment
that still holds one used chunk among many unused ones.
"""

from __future__ import annotations

import errno
import itertools
import logging
import mmap
import os
import shutil
import struct
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from monarch_rdmafs.errors import CorruptChunk, StoreFull
from monarch_rdmafs.manifest import CHUNK_SIZE, chunk_id
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
#: No chunk is bigger (a file is cut into chunks of CHUNK_SIZE).
CHUNK_MAX = CHUNK_SIZE
log = logging.getLogger("monarch.rdmafs.store")
#: Pack files kept open in a reading process (a mount reads many small files from a few packs).
_OPEN_PACKS = 64
#: A segment (big chunks one after another) is closed, and the next begins, once it holds this much.
SEGMENT_MAX = 1 << 30
_SEG_ENTRY = struct.Struct("<16sQQ")  # a segment's index entry: id's 16 bytes, offset, length
#: A segment's disk space is reserved ahead of its writes (fallocate, its size unchanged): as much
#: again as it holds, up to this much at a time (a small workspace reserves little; the space past
#: its end is given back when the segment is closed, :meth:`ChunkStore.close`).  Without it, the
#: four hosts of one machine appending at once got 8 MiB extents interleaved on the disk: 32
#: extents for 256 MiB, read in order at ~0.6 GB/s against ~2.5-3 GB/s for 4 extents.
SEGMENT_RESERVE = 128 << 20
_FALLOC_FL_KEEP_SIZE = 1
_BAD = ".bad"
_IDX = ".idx"


@dataclass
class _Segment:
    """A segment this store (its one writer) appends to: data at ``pos``, entries at the index's end."""

    name: str
    fd: int
    idx_fd: int
    direct: bool
    pos: int = 0
    idx_size: int = 0
    reserved: int = 0


@dataclass
class _SegIndex:
    """What a process has read of one segment's index and bad list."""

    ids: list = field(default_factory=list)
    idx_read: int = 0
    bad_read: int = 0
    bad: set = field(default_factory=set)  # (id, offset) found corrupt, by any process


class ReadStream:
    """Segment files one reader keeps open while it reads a file's chunks in order: the kernel's
    read-ahead of a file is kept per open file, so one reading in order has it grow (to 16 MiB
    here), and the disk reads ahead in large requests."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()



def _pwrite_aligned(fd: int, data: memoryview, offset: int) -> None:
    """``data`` written at ``offset`` (a block boundary) of an O_DIRECT file, through an aligned buffer of
    this thread's (reused, so its pages are warm); a last partial block is padded with zeros (the
    caller cuts a file's end back to its size)."""
    bounce = getattr(_local, "bounce", None)
    if bounce is None:
        bounce = _local.bounce = mmap.mmap(-1, _BOUNCE)
    n, pos = data.nbytes, 0
    while pos < n:
        k = min(_BOUNCE, n - pos)
        bounce[:k] = data[pos:pos + k]
        padded = _aligned(k)
        if padded > k:
            bounce[k:padded] = bytes(padded - k)
        view = memoryview(bounce)
        try:
            done = 0
            while done < padded:
                done += os.pwrite(fd, view[done:padded], offset + pos + done)
        finally:
            view.release()
        pos += k

class ChunkStore:
    """The chunks one host has, under ``root``."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._chunks = os.path.join(self.root, "chunks")
        self._packs = os.path.join(self.root, "packs")
        self._segs = os.path.join(self.root, "segs")
        self._tmp = os.path.join(self.root, "tmp")
        self._made = False
        self._subdirs: set[str] = set()  # chunks/<2 hex> folders made by this process
        self._tmp_names = itertools.count()
        #: Whether big chunks are written with O_DIRECT (until the file system refuses it once).
        self._direct = bool(_O_DIRECT) and os.environ.get("MONARCH_RDMAFS_DIRECT", "1") != "0"
        #: Whether :meth:`read_into` reads with O_DIRECT (until the file system refuses it once).
        self._direct_read = self._direct
        #: Whether segments are written with O_DIRECT too: not by default.  Bytes written past the page
        #: cache were read back here at ~0.6-1.0 GB/s the first time (the virtual disk's own cache, below
        #: this machine, keeps what went through the page cache: ~2-3 GB/s), and a mount's first read
        #: is that read; the page cache costs the sync CPU (512 MiB to 4 hosts: 1.8 -> 3.6 s) but not
        #: its place against rsync (0.41-0.83x -> 0.59-0.63x, same runs).
        self._seg_direct = self._direct and os.environ.get("MONARCH_RDMAFS_SEGMENT_DIRECT") == "1"
        # Chunks this process has read back and found to hash to their id.
        self._verified: set[str] = set()
        # Packed chunks: id -> (pack name, offset, length); and each pack read so far -> its ids.
        self._packed: dict[str, tuple[str, int, int]] = {}
        self._pack_ids: dict[str, list[str]] = {}
        self._pack_files: dict[str, Any] = {}  # pack name -> open file (a reader holds it while it reads)
        self._lock = threading.Lock()  # the pack and segment indexes: a mount reads on several threads
        # Big chunks in segments: id -> (segment, offset, length); and each segment read so far.
        self._segged: dict[str, tuple[str, int, int]] = {}
        self._seg_index: dict[str, _SegIndex] = {}
        self._seg: _Segment | None = None  # the segment this (writing) store appends to

    def clean(self) -> None:
        """Remove what a killed writer left in ``tmp/`` (only the store's one writer calls this, at start)."""
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._made = False

    def _make(self) -> None:
        if not self._made:
            private_dir(self._chunks, top=self.root)
            private_dir(self._packs, top=self.root)
            private_dir(self._segs, top=self.root)
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
        # A chunk file is looked for each time (not remembered): a mount process that found it corrupt
        # removed it, and this store (the agent's) must then say it is missing, so that the next sync
        # sends it again.  Small chunks are in packs, whose indexes are in memory: a commit of 10,000
        # files stats none of them.
        if not is_chunk_id(cid):
            return False
        if cid in self._packed or cid in self._segged or os.path.exists(self.path(cid)):
            return True
        if not refresh:
            return False
        self._load_packs()
        self._load_segs()
        return cid in self._packed or cid in self._segged

    def missing(self, ids) -> list[str]:
        """The ids of ``ids`` this store does not have, in order, without repeats."""
        self._load_packs()  # once for all of them
        self._load_segs()
        return [c for c in dict.fromkeys(ids) if not self._has(c, refresh=False)]

    def put(self, cid: str, data: bytes | memoryview) -> bool:
        """Store ``data`` as ``cid``; False if it was already there.

        Raises CorruptChunk if the bytes do not hash to ``cid``, StoreFull if the disk is full.
        """
        if chunk_id(data) != cid:
            raise CorruptChunk(f"chunk {cid[:12]} arrived corrupted")
        final = self.path(cid)
        if cid in self._packed or cid in self._segged or os.path.exists(final):
            return False
        self._write_file(final, [data])
        self._verified.add(cid)
        return True

    def put_many(self, items: Iterable[tuple[str, Any]]) -> tuple[int, int, list[str]]:
        """Store the chunks of ``items`` (id, bytes-like) this store lacks; (how many stored, their bytes, corrupt ids).

        Each is checked against its id first (a corrupt one is listed, not stored).  Chunks of at
        most :data:`PACK_CHUNK_MAX` bytes go together into one new pack, renamed in whole; bigger
        ones are appended, in their order, to this store's segment (:meth:`_append`): the chunks of
        a big file lie one after the other in one file, which a mount reads in order.  Raises
        StoreFull if the disk is full.
        """
        small: list[tuple[str, Any]] = []
        big: list[tuple[str, Any]] = []
        taken: set[str] = set()
        corrupt: list[str] = []
        stored = size = 0
        self._load_packs()
        self._load_segs()
        for cid, data in items:
            if cid in taken or not is_chunk_id(cid) or self._has(cid, refresh=False):
                continue
            if chunk_id(data) != cid:
                corrupt.append(cid)
                continue
            taken.add(cid)
            (small if len(data) <= PACK_CHUNK_MAX else big).append((cid, data))
        if big:
            self._append(big)
            self._verified.update(c for c, _ in big)
            stored += len(big)
            size += sum(len(d) for _, d in big)
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
            _pwrite_aligned(fd, data, 0)
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

    # -- segments -----------------------------------------------------------------

    def _append(self, items: list[tuple[str, Any]]) -> None:
        """Append big chunks to this store's segment, each at a 4 KiB boundary, then their index entries.

        ``segs/<name>`` holds the bytes; ``segs/<name>.idx`` an entry per chunk (id, offset, length),
        written only once the bytes are: a reader (another process) never finds an entry whose bytes
        are not there yet, and a writer killed between the two leaves bytes no entry names (never
        served, gone with the segment).  A failed write (a full disk) cuts both files back to where
        they were and closes the segment: nothing half written is ever named.  The bytes go past the
        page cache only if ``MONARCH_RDMAFS_SEGMENT_DIRECT=1`` (see ``_seg_direct``)."""
        self._make()
        seg = self._seg
        need = sum(_aligned(len(d)) for _, d in items)
        if seg is not None and seg.pos and seg.pos + need > SEGMENT_MAX:
            self._close_segment()
            seg = None
        if seg is None:
            try:
                seg = self._seg = self._new_segment()
            except OSError as e:
                raise _full(e, self.root) from None
        start, idx_start = seg.pos, seg.idx_size
        if seg.pos + need > seg.reserved:
            end = seg.pos + need
            seg.reserved = _reserve(seg.fd, seg.reserved, end + min(SEGMENT_RESERVE, end))
        try:
            entries = []
            for cid, data in items:
                view = memoryview(data).cast("B")
                self._seg_write(seg, view)
                entries.append((cid, seg.pos, view.nbytes))
                seg.pos += _aligned(view.nbytes)
            raw = b"".join(_SEG_ENTRY.pack(bytes.fromhex(c), o, n) for c, o, n in entries)
            done = 0
            while done < len(raw):
                done += os.write(seg.idx_fd, raw[done:])
            seg.idx_size += len(raw)
        except OSError as e:
            for fd, size in ((seg.idx_fd, idx_start), (seg.fd, start)):
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass
            self._close_segment()
            raise _full(e, self.root) from None
        with self._lock:
            index = self._seg_index.setdefault(seg.name, _SegIndex())
            index.idx_read = seg.idx_size  # its own entries: not read back
            self._add_seg_entries(seg.name, index, entries)

    def _new_segment(self) -> _Segment:
        name = uuid.uuid4().hex
        path = os.path.join(self._segs, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        # Both read-only files (this store's descriptors write them); only a bad list is appended by others.
        idx_fd = os.open(path + _IDX, flags | os.O_APPEND, 0o400)
        try:
            direct = self._seg_direct
            try:
                fd = os.open(path, flags | (_O_DIRECT if direct else 0), 0o400)
            except OSError as e:
                if not direct or e.errno != errno.EINVAL:
                    raise
                self._seg_direct = direct = False
                fd = os.open(path, flags, 0o400)
        except BaseException:
            os.close(idx_fd)
            _unlink(path + _IDX)
            raise
        return _Segment(name, fd, idx_fd, direct)

    def close(self) -> None:
        """Stop appending to the current segment (the next big chunk starts another); the space reserved
        past its end is given back.  The writer calls it when it stops."""
        self._close_segment()

    def _close_segment(self) -> None:
        seg, self._seg = self._seg, None
        if seg is not None:
            if seg.reserved > seg.pos:
                try:
                    os.ftruncate(seg.fd, seg.pos)  # gives back the space reserved past its end
                except OSError:
                    pass
            os.close(seg.fd)
            os.close(seg.idx_fd)

    def _seg_write(self, seg: _Segment, data: memoryview) -> None:
        """``data`` written at ``seg.pos`` (a 4 KiB boundary); through an aligned buffer with O_DIRECT."""
        n = data.nbytes
        if not seg.direct:
            done = 0
            while done < n:
                done += os.pwrite(seg.fd, data[done:], seg.pos + done)
            return
        _pwrite_aligned(seg.fd, data, seg.pos)

    def _add_seg_entries(self, name: str, index: _SegIndex, entries: list[tuple[str, int, int]]) -> None:
        # Called with the lock held.
        for cid, off, n in entries:
            if (cid, off) in index.bad:
                continue
            index.ids.append((cid, off))
            if cid not in self._segged and cid not in self._packed:
                self._segged[cid] = (name, off, n)

    def _load_segs(self) -> bool:
        """Read what was appended to every segment's index since the last call, and its bad list; True
        if a chunk was added.  Segments gone from the folder are forgotten (gc, or a whole one found cut
        short), so this store then says their chunks are missing."""
        try:
            names = {n for n in os.listdir(self._segs) if "." not in n}
        except FileNotFoundError:
            names = set()
        for gone in set(self._seg_index).difference(names):
            self._forget_segment(gone)
        added = False
        for name in names:
            added |= self._read_seg_index(name)
        return added

    def _read_seg_index(self, name: str) -> bool:
        path = os.path.join(self._segs, name)
        with self._lock:
            index = self._seg_index.setdefault(name, _SegIndex())
            idx_read, bad_read = index.idx_read, index.bad_read
        entries: list[tuple[str, int, int]] = []
        bad: list[tuple[str, int]] = []
        try:
            size = os.stat(path).st_size
            with open(path + _IDX, "rb", buffering=0) as f:
                f.seek(idx_read)
                raw = f.read()
            raw = raw[:len(raw) - len(raw) % _SEG_ENTRY.size]  # an entry still being written: read next time
            for digest, off, n in _SEG_ENTRY.iter_unpack(raw):
                # An entry outside the bytes (a file cut short) is not trusted: that chunk is missing.
                if off % _ALIGN == 0 and n <= CHUNK_MAX and off + n <= size:
                    entries.append((digest.hex(), off, n))
            idx_read += len(raw)
        except FileNotFoundError:
            return False  # a segment being removed, or one being made (its index comes first)
        try:
            with open(path + _BAD, "rb", buffering=0) as f:
                f.seek(bad_read)
                text = f.read()
            text = text[:text.rfind(b"\n") + 1]
            bad_read += len(text)
            for line in text.decode("ascii", "replace").splitlines():
                cid, _, off = line.partition(" ")
                if is_chunk_id(cid) and off.isdigit():
                    bad.append((cid, int(off)))
        except FileNotFoundError:
            pass
        with self._lock:
            index.idx_read, index.bad_read = idx_read, bad_read
            for cid, off in bad:
                index.bad.add((cid, off))
                if self._segged.get(cid, ("", -1))[:2] == (name, off):
                    del self._segged[cid]
                    self._verified.discard(cid)
            before = len(self._segged)
            self._add_seg_entries(name, index, entries)
            return len(self._segged) > before

    def _forget_segment(self, name: str) -> None:
        with self._lock:
            index = self._seg_index.pop(name, None)
            for cid, _ in index.ids if index else ():
                if self._segged.get(cid, ("",))[0] == name:
                    del self._segged[cid]
                    self._verified.discard(cid)

    def _mark_bad(self, cid: str, where: tuple[str, int, int]) -> None:
        """Note in the segment's bad list that ``cid`` at its offset there is corrupt: every process
        (the agent's store among them) then finds it missing, and the next sync appends it again."""
        name, off, _ = where
        try:
            fd = os.open(os.path.join(self._segs, name + _BAD),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, f"{cid} {off}\n".encode())
            finally:
                os.close(fd)
        except OSError as e:
            log.warning("could not note chunk %s as corrupt: %s", cid[:12], e)
        with self._lock:
            index = self._seg_index.get(name)
            if index is not None:
                index.bad.add((cid, off))
            if self._segged.get(cid) == where:
                del self._segged[cid]

    def _seg_fd(self, name: str, stream: ReadStream | None) -> tuple[int, bool]:
        """(a descriptor of segment ``name``, whether the caller closes it)."""
        if stream is not None:
            fd = stream.fds.get(name)
            if fd is None:
                fd = stream.fds[name] = os.open(os.path.join(self._segs, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # twice the read-ahead
                except OSError:
                    pass
            return fd, False
        return os.open(os.path.join(self._segs, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), True

    def _read_segged(self, cid: str, view: memoryview | None = None, stream: ReadStream | None = None):
        """``cid``'s bytes from its segment (into ``view`` if given: how many), not checked yet; None if
        it is in none (or its segment is gone)."""
        where = self._segged.get(cid)
        if where is None:
            return None
        name, off, n = where
        try:
            fd, close = self._seg_fd(name, stream)
        except FileNotFoundError:
            return None
        try:
            if view is None:
                return os.pread(fd, n, off)
            got = 0
            while got < n:
                k = os.preadv(fd, [view[got:n]], off + got)
                if k <= 0:
                    break
                got += k
            return got
        finally:
            if close:
                os.close(fd)

    # -- packs --------------------------------------------------------------------

    def _add_pack(self, name: str, entries: list[tuple[str, int, int]]) -> None:
        with self._lock:
            self._pack_ids[name] = [cid for cid, _, _ in entries]
            for cid, off, n in entries:
                self._packed.setdefault(cid, (name, off, n))

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

    def _open_any(self, cid: str, direct: bool = False) -> tuple[int, bytes | None]:
        """(a descriptor of ``cid``'s file, None), or (-1, its bytes) if it is packed or in a segment;
        not checked yet.

        Raises OSError if it is in none.  The packs and segments folders are listed again (what
        another process added since) only when there is no file."""
        for _ in range(2):
            if cid in self._packed:
                data = self._read_packed(cid)
                if data is not None:
                    return -1, data
            if cid in self._segged:
                data = self._read_segged(cid)
                if data is not None:
                    return -1, data
            try:
                return self._open(cid, direct), None
            except FileNotFoundError:
                # (Whether this call added it or another thread's did just before: the index says.)
                self._load_packs()
                self._load_segs()
                if cid not in self._packed and cid not in self._segged:
                    raise
        raise FileNotFoundError(errno.ENOENT, f"chunk {cid[:12]} is not in the store")

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

    def read_into(self, cid: str, buf: Any, stream: ReadStream | None = None) -> "memoryview | bytes":
        """``cid``'s bytes, checked against its hash on every call: a chunk that is a file of its own is read
        past the page cache (O_DIRECT, in one request) into ``buf``, a page-aligned writable buffer of at
        least :data:`~monarch_rdmafs.manifest.CHUNK_SIZE` bytes, and a view of it returned; a packed chunk's
        bytes are returned as they are (``buf`` unused).  Raises CorruptChunk, or OSError if it is missing.

        How a mount reads a big chunk: a buffered read (or a mapping) fills fresh page-cache pages of
        the store's file, and the mount's own page cache takes a second copy of every page; fresh pages
        are the dearest memory here (see :meth:`_write_direct`).  One request into a buffer the mount
        reuses costs the disk's time alone, and several on threads keep the disk busy.  The hash is
        taken on every read: the bytes come from the disk each time, not from checked pages.

        A chunk in a segment is read through the page cache instead, with ``stream``'s descriptor
        of that segment where given (a reader of a file's chunks in order): there the kernel's
        read-ahead of one file read in order is what keeps the disk busiest (~2.5 GB/s here, against
        ~1 GB/s for O_DIRECT requests of 4 MiB, however many at once).
        """
        view = memoryview(buf)
        for attempt in range(3):
            where = self._segged.get(cid)
            if where is None:
                if attempt == 0 and cid not in self._packed and not os.path.exists(self.path(cid)):
                    self._load_segs()  # appended since this process last looked (a mount's first read)
                    continue
                break
            got = self._read_segged(cid, view, stream)
            if got is None:
                self._load_segs()  # its segment is gone (gc): read where the store has it now
                continue
            data = view[:got]
            if got != where[2] or chunk_id(data) != cid:
                self.discard(cid)
                raise CorruptChunk(f"chunk {cid[:12]} in the store at {self.root} does not match its hash",
                                   "sync the workspace again (the chunk is replaced)")
            self._verified.add(cid)
            return data
        fd, packed = self._open_any(cid, direct=True)
        if packed is not None:  # packed, or found in a segment only now (another process added it)
            self._check(cid, packed)
            return packed
        try:
            size = os.fstat(fd).st_size
            if size > len(view):
                raise CorruptChunk(f"chunk {cid[:12]} in the store at {self.root} is bigger than a chunk",
                                   "sync the workspace again (the chunk is replaced)")
            try:
                got = _read_view(fd, view[:-(-size // _ALIGN) * _ALIGN], size)
            except OSError as e:
                if e.errno != errno.EINVAL or not self._direct_read:
                    raise
                # Opened with O_DIRECT, refused at the read (a file system that takes the flag only):
                # read through the page cache from now on.
                self._direct_read = False
                os.close(fd)
                fd = self._open(cid)
                got = _read_view(fd, view, size)
            data = view[:got]
        finally:
            os.close(fd)
        if len(data) != size or chunk_id(data) != cid:
            self.discard(cid)  # so the next sync sends it again
            raise CorruptChunk(f"chunk {cid[:12]} in the store at {self.root} does not match its hash",
                               "sync the workspace again (the chunk is replaced)")
        self._verified.add(cid)
        return data

    def _open(self, cid: str, direct: bool = False) -> int:
        # O_NOFOLLOW: a chunk is a plain file of ours, never a link to something else.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        if direct and self._direct_read:
            try:
                return os.open(self.path(cid), flags | _O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._direct_read = False  # a file system without O_DIRECT (tmpfs): read through the page cache
        return os.open(self.path(cid), flags)

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
        the rest of it is sent again too; a chunk in a segment goes alone, named in its bad list)."""
        where = self._packed.get(cid)
        if where is not None:
            self._drop_pack(where[0])
        seg = self._segged.get(cid)
        if seg is not None:
            self._mark_bad(cid, seg)
        _unlink(self.path(cid))
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
        self._load_segs()
        current = self._seg.name if self._seg is not None else ""
        for name, index in list(self._seg_index.items()):
            if name == current or any(c in keep for c, _ in index.ids):
                continue  # the segment still appended to, or one a kept chunk is in
            path = os.path.join(self._segs, name)
            try:
                if older_than is not None and os.stat(path).st_mtime >= older_than:
                    continue
            except OSError:
                pass
            for suffix in (_IDX, _BAD, ""):  # the index first: a half-removed segment names nothing
                _unlink(path + suffix)
            removed += len({c for c, _ in index.ids})
            self._forget_segment(name)
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
        self._load_segs()
        with self._lock:
            count += len(self._packed) + len(self._segged)
            size += sum(n for _, _, n in self._packed.values()) + sum(n for _, _, n in self._segged.values())
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


_fallocate = None


def _reserve(fd: int, start: int, end: int) -> int:
    """Reserve ``fd``'s disk space from ``start`` to ``end`` in one extent where the file system can,
    its size unchanged (Linux ``fallocate`` with KEEP_SIZE); best effort: what is reserved now."""
    global _fallocate
    try:
        if _fallocate is None:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            _fallocate = libc.fallocate
            _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        st = os.fstatvfs(fd)
        if end - start > st.f_bavail * st.f_frsize // 4:
            return start  # a nearly full disk: its room is the writes' (and the indexes')
        if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, start, end - start) == 0:
            return end
        # No room for all of it: what a failed call may have reserved is given back, so the writes
        # have all the room there is.
        os.ftruncate(fd, os.fstat(fd).st_size)
    except (OSError, AttributeError):
        pass
    return start  # no fallocate here, or no room: the writes decide


def _full(e: OSError, root: str) -> OSError | StoreFull:
    """``e``, or StoreFull if it says the disk is full."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFull(f"no space left on the host's disk at {root}",
                         "free space there; the previous workspace generation is still served")
    return e


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _read_view(fd: int, view: memoryview, size: int) -> int:
    """Read ``fd`` from its start into ``view`` until ``size`` bytes or its end; how many were read."""
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:]], got)
        if n <= 0:
            break
        got += n
    return min(got, size)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
