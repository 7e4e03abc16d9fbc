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
