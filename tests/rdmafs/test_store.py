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


def test_put_many_packs_small_chunks_into_one_file_and_big_ones_into_their_own(tmp_path):
    s = ChunkStore(str(tmp_path / "s"))
    small = [f"file {i}\n".encode() * (i + 1) for i in range(50)]
    big = [os.urandom(4 << 20), os.urandom((1 << 20) + 5)]  # the second's last block is partial
    items = [(chunk_id(d), d) for d in small + big]
    stored, size, corrupt = s.put_many(items + items[:3])  # repeats are stored once
    assert (stored, size, corrupt) == (52, sum(map(len, small + big)), [])
    assert len(os.listdir(os.path.join(s.root, "packs"))) == 1, "the 50 small chunks are one file"
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
