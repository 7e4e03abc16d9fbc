"""The chunk store: content addressing, corruption, a full disk, garbage collection."""

from __future__ import annotations

import os
import time

import pytest

from monarch_rdmafs.errors import CorruptChunk, StoreFull
from monarch_rdmafs.manifest import chunk_id
from monarch_rdmafs.store import ChunkStore


def test_put_has_missing_get(tmp_path):
    s = ChunkStore(str(tmp_path / "s"))
    a, b = b"alpha" * 100, b"beta"
    ida, idb = chunk_id(a), chunk_id(b)
    assert s.missing([ida, idb, ida]) == [ida, idb]
    assert s.put(ida, a) is True
    assert s.put(ida, a) is False  # already there: not written again
    assert s.has(ida) and not s.has(idb)
    assert s.missing([ida, idb]) == [idb]
    assert s.get(ida) == a
    assert os.stat(s.path(ida)).st_mode & 0o222 == 0, "chunks are read-only files"


def test_a_corrupted_chunk_is_refused(tmp_path):
    s = ChunkStore(str(tmp_path / "s"))
    good = b"payload" * 1000
    bad = bytearray(good)
    bad[10] ^= 0xFF
    with pytest.raises(CorruptChunk):
        s.put(chunk_id(good), bytes(bad))
    assert not s.has(chunk_id(good))
    assert [f for _, _, files in os.walk(s.root) for f in files] == []  # not even half a chunk in tmp/


def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_chunk(tiny_disk):
    s = ChunkStore(str(tiny_disk / "s"))
    small = b"fits"
    s.put(chunk_id(small), small)
    big = os.urandom(3 << 20)
    with pytest.raises(StoreFull) as e:
        s.put(chunk_id(big), big)
    assert "no space left" in e.value.message and "previous workspace generation is still served" in e.value.hint
    assert not s.has(chunk_id(big))
    assert os.listdir(os.path.join(s.root, "tmp")) == []
    assert s.get(chunk_id(small)) == small


def test_gc_keeps_what_is_used_and_what_is_recent(tmp_path):
    s = ChunkStore(str(tmp_path / "s"))
    ids = []
    for i in range(3):
        data = f"chunk {i}".encode()
        s.put(chunk_id(data), data)
        ids.append(chunk_id(data))
    assert s.gc({ids[0]}, older_than=time.time() - 600) == 0, "recent chunks stay (a sync may be in flight)"
    assert s.gc({ids[0]}) == 2
    assert s.has(ids[0]) and not s.has(ids[1])
    assert s.statistics()["chunks"] == 1


def test_clean_removes_what_a_killed_writer_left(tmp_path):
    s = ChunkStore(str(tmp_path / "s"))
    kept = b"a whole chunk"
    s.put(chunk_id(kept), kept)
    with open(os.path.join(s.root, "tmp", "half"), "wb") as f:
        f.write(b"half a chunk")
    fresh = ChunkStore(str(tmp_path / "s"))
    fresh.clean()
    assert not os.path.exists(os.path.join(s.root, "tmp", "half"))
    assert fresh.has(chunk_id(kept)) and fresh.get(chunk_id(kept)) == kept
    assert fresh.put(chunk_id(b"next"), b"next")  # tmp/ is made again for the next chunk


@pytest.mark.parametrize("direct", ["0", "1"])
def test_put_many_packs_small_chunks_into_one_file_and_big_ones_into_a_segment(tmp_path, monkeypatch, direct):
    """(``direct``: segments written through the page cache, the default, or past it.)"""
    monkeypatch.setenv("MONARCH_RDMAFS_SEGMENT_DIRECT", direct)
    s = ChunkStore(str(tmp_path / "s"))
    small = [f"file {i}\n".encode() * (i + 1) for i in range(50)]
    big = [os.urandom(4 << 20), os.urandom((1 << 20) + 5)]  # the second's last block is partial
    items = [(chunk_id(d), d) for d in small + big]
    stored, size, corrupt = s.put_many(items + items[:3])  # repeats are stored once
    assert (stored, size, corrupt) == (52, sum(map(len, small + big)), [])
    assert len(os.listdir(os.path.join(s.root, "packs"))) == 1, "the 50 small chunks are one file"
    segs = os.listdir(os.path.join(s.root, "segs"))
    assert len(segs) == 2, "the big ones: a segment and its index"
    assert [f for _, _, fs in os.walk(os.path.join(s.root, "chunks")) for f in fs] == [], "no chunk files"
    seg = os.path.join(s.root, "segs", min(segs, key=len))
    with open(seg, "rb") as f:  # one after the other, in order, each at a 4 KiB boundary
        assert f.read(4 << 20) == big[0] and f.read((1 << 20) + 5) == big[1]
    assert s.put_many(items) == (0, 0, [])
    reader = ChunkStore(s.root)  # another process: it finds the pack by itself
    assert reader.missing([c for c, _ in items]) == []
    for cid, data in items:
        assert reader.get(cid) == data and bytes(reader.map(cid)) == data
        fd = reader.read_fd(cid)
        try:
            assert os.read(fd, len(data) + 1) == data
        finally:
            os.close(fd)
    for dirpath, _, files in os.walk(s.root):
        assert os.stat(dirpath).st_mode & 0o777 == 0o700
        for f in files:
            assert os.stat(os.path.join(dirpath, f)).st_mode & 0o777 == 0o400
    assert reader.statistics() == {"chunks": 52, "bytes": size}


def test_put_many_lists_corrupt_chunks_and_stores_the_rest(tmp_path):
    s = ChunkStore(str(tmp_path / "s"))
    good, bad = b"good bytes", b"bad bytes"
    stored, _, corrupt = s.put_many([(chunk_id(good), good), (chunk_id(b"what was sent"), bad)])
    assert stored == 1 and corrupt == [chunk_id(b"what was sent")]
    assert s.has(chunk_id(good)) and not s.has(chunk_id(b"what was sent"))


def test_a_pack_goes_at_gc_only_once_none_of_its_chunks_is_used(tmp_path):
    s = ChunkStore(str(tmp_path / "s"))
    one = [(chunk_id(d), d) for d in (b"a", b"b")]
    two = [(chunk_id(d), d) for d in (b"c", b"d")]
    s.put_many(one)
    s.put_many(two)
    keep = {one[0][0]}
    assert s.gc(keep, older_than=time.time() - 600) == 0, "recent packs stay (a sync may be in flight)"
    assert s.gc(keep) == 2
    assert len(os.listdir(os.path.join(s.root, "packs"))) == 1
    fresh = ChunkStore(s.root)
    assert fresh.missing([c for c, _ in one + two]) == [c for c, _ in two]
    assert fresh.get(one[1][0]) == b"b", "an unused chunk of a used pack stays readable"


def test_a_file_that_is_not_a_pack_is_ignored(tmp_path):
    s = ChunkStore(str(tmp_path / "s"))
    s.put_many([(chunk_id(b"x"), b"x")])
    packs = os.path.join(s.root, "packs")
    with open(os.path.join(packs, "junk"), "wb") as f:
        f.write(b"MRFSPAK1" * 3)  # a footer that claims more entries than the file holds
    fresh = ChunkStore(s.root)
    assert fresh.has(chunk_id(b"x")) and fresh.get(chunk_id(b"x")) == b"x"


def test_read_into_reads_a_chunk_file_whole_and_checks_it_on_every_read(tmp_path):
    """How a mount reads a big chunk kept as a file of its own (``put``, or a store from before
    segments): into its own buffer (O_DIRECT where the file system takes it), hashed each time; a
    chunk changed or cut short on disk is CorruptChunk and leaves the store, so the next sync sends
    it again.  A packed chunk comes back as its bytes."""
    import mmap

    from monarch_rdmafs.manifest import CHUNK_SIZE

    s = ChunkStore(str(tmp_path / "s"))
    whole, partial, small = os.urandom(CHUNK_SIZE), os.urandom((1 << 20) + 5), b"small\n"
    for data in (whole, partial):
        s.put(chunk_id(data), data)
    s.put_many([(chunk_id(small), small)])
    buf = mmap.mmap(-1, CHUNK_SIZE)
    reader = ChunkStore(s.root)
    for data in (whole, partial, small):
        for _ in range(2):
            assert bytes(reader.read_into(chunk_id(data), buf)) == data
    for spoil in ("flip", "cut"):
        path = s.path(chunk_id(partial))
        os.chmod(path, 0o600)
        with open(path, "r+b") as f:
            if spoil == "flip":
                f.seek(12345)
                f.write(bytes([partial[12345] ^ 1]))
            else:
                f.truncate(len(partial) - 4096)
        with pytest.raises(CorruptChunk):
            reader.read_into(chunk_id(partial), buf)
        assert not os.path.exists(path), "a corrupt chunk leaves the store"
        assert s.missing([chunk_id(partial)]) == [chunk_id(partial)], "the agent's store: the next sync sends it"
        s.put(chunk_id(partial), partial)  # the next sync's repair
        assert bytes(reader.read_into(chunk_id(partial), buf)) == partial
    with pytest.raises(OSError):
        reader.read_into(chunk_id(b"never stored"), buf)


def _segment_of(store: ChunkStore, cid: str) -> tuple[str, int, int]:
    """(segment file, offset, length) of ``cid`` as a reader of the store finds it."""
    reader = ChunkStore(store.root)
    reader.missing([cid])
    name, off, n = reader._segged[cid]
    return os.path.join(store.root, "segs", name), off, n


def test_a_corrupt_chunk_in_a_segment_is_an_error_and_alone_is_sent_again(tmp_path):
    """A chunk whose bytes changed in its segment: CorruptChunk for the reader (a mount: EIO, never
    the bytes), noted in the segment's bad list, so the writer's store (the agent's, another
    process) finds it missing and the next sync appends it again; the rest of the segment stays."""
    import mmap

    from monarch_rdmafs.manifest import CHUNK_SIZE

    s = ChunkStore(str(tmp_path / "s"))
    chunks = [os.urandom(CHUNK_SIZE), os.urandom(CHUNK_SIZE), os.urandom((1 << 20) + 5)]
    ids = [chunk_id(d) for d in chunks]
    s.put_many(list(zip(ids, chunks)))
    reader = ChunkStore(s.root)  # the mount process
    buf = mmap.mmap(-1, CHUNK_SIZE)
    assert [bytes(reader.read_into(c, buf)) for c in ids] == chunks
    path, off, _ = _segment_of(s, ids[1])
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.seek(off + 100)
        f.write(bytes([chunks[1][100] ^ 1]))
    with pytest.raises(CorruptChunk):
        reader.read_into(ids[1], buf)
    with pytest.raises(FileNotFoundError):
        ChunkStore(s.root).get(ids[1])  # a fresh reader finds it missing
    assert [bytes(reader.read_into(c, buf)) for c in (ids[0], ids[2])] == [chunks[0], chunks[2]]
    assert s.missing(ids) == [ids[1]], "the writer learns it from the bad list"
    assert ChunkStore(s.root).missing(ids) == [ids[1]]
    assert s.put_many([(ids[1], chunks[1])]) == (1, CHUNK_SIZE, []), "the next sync's repair"
    assert bytes(reader.read_into(ids[1], buf)) == chunks[1], "the reader finds the new copy"
    fresh = ChunkStore(s.root)
    assert fresh.missing(ids) == [] and [fresh.get(c) for c in ids] == chunks


def test_a_segment_cut_short_serves_what_it_still_holds(tmp_path):
    """A segment truncated (a full disk, a crash of the host): an entry past its end is never trusted
    by a fresh reader (missing, so sent again); a reader that had it finds it short: CorruptChunk."""
    import mmap

    from monarch_rdmafs.manifest import CHUNK_SIZE

    s = ChunkStore(str(tmp_path / "s"))
    chunks = [os.urandom(CHUNK_SIZE), os.urandom(CHUNK_SIZE)]
    ids = [chunk_id(d) for d in chunks]
    s.put_many(list(zip(ids, chunks)))
    reader = ChunkStore(s.root)
    assert reader.missing(ids) == []
    path, off, _ = _segment_of(s, ids[1])
    os.truncate(path, off + 4096)
    buf = mmap.mmap(-1, CHUNK_SIZE)
    with pytest.raises(CorruptChunk):
        reader.read_into(ids[1], buf)
    assert bytes(reader.read_into(ids[0], buf)) == chunks[0]
    assert ChunkStore(s.root).missing(ids) == [ids[1]]
    assert s.missing(ids) == [ids[1]]
    s.put_many([(ids[1], chunks[1])])
    assert ChunkStore(s.root).get(ids[1]) == chunks[1]


def test_a_write_that_fills_the_disk_names_nothing_half_written(tiny_disk):
    """StoreFull while appending to a segment: the segment is cut back to before the batch, nothing
    of it is named, and the chunks stored before stay readable."""
    s = ChunkStore(str(tiny_disk / "s"))
    first = os.urandom(1 << 20)
    s.put_many([(chunk_id(first), first)])
    big = [os.urandom(2 << 20) for _ in range(2)]
    with pytest.raises(StoreFull):
        s.put_many([(chunk_id(d), d) for d in big])
    fresh = ChunkStore(s.root)
    assert fresh.missing([chunk_id(d) for d in big]) == [chunk_id(d) for d in big]
    assert fresh.get(chunk_id(first)) == first and s.get(chunk_id(first)) == first


def test_gc_drops_a_segment_once_none_of_its_chunks_is_used(tmp_path):
    root = str(tmp_path / "s")
    old, new = os.urandom(1 << 20), os.urandom(1 << 20)
    ChunkStore(root).put_many([(chunk_id(old), old)])  # an earlier agent's segment
    s = ChunkStore(root)
    s.put_many([(chunk_id(new), new)])
    assert len(os.listdir(os.path.join(root, "segs"))) == 4
    assert s.gc({chunk_id(new)}, older_than=time.time() - 600) == 0, "recent segments stay"
    assert s.gc(set()) == 1, "the segment being appended to stays: only the other goes"
    assert len(os.listdir(os.path.join(root, "segs"))) == 2
    assert ChunkStore(root).missing([chunk_id(old), chunk_id(new)]) == [chunk_id(old)]
    assert s.get(chunk_id(new)) == new


def test_a_segment_reserves_space_in_proportion_and_gives_it_back_when_closed(tmp_path):
    """Space is reserved ahead of a segment's writes (one extent on the disk, not the hosts' writes
    interleaved), as much again as it holds: a small workspace reserves little; ``close`` (its
    writer stopping) gives back what is past the end, and the next chunk starts a new segment."""
    s = ChunkStore(str(tmp_path / "s"))
    one, two = os.urandom(1 << 20), os.urandom(1 << 20)
    s.put_many([(chunk_id(one), one)])
    (seg,) = [os.path.join(s.root, "segs", n) for n in os.listdir(os.path.join(s.root, "segs")) if "." not in n]
    assert os.stat(seg).st_size == 1 << 20
    assert os.stat(seg).st_blocks * 512 <= (2 << 20) + (64 << 10)
    s.close()
    assert os.stat(seg).st_blocks * 512 <= (1 << 20) + (64 << 10)
    s.put_many([(chunk_id(two), two)])
    assert len([n for n in os.listdir(os.path.join(s.root, "segs")) if "." not in n]) == 2
    fresh = ChunkStore(s.root)
    assert fresh.get(chunk_id(one)) == one and fresh.get(chunk_id(two)) == two
