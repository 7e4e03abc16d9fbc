"""Workspace chunks are checked against their hash when read back, and a manifest cannot name a path
outside its tree (issue #24, findings 1 and 7).

The store's folder is private now (tests/security/test_private_folders.py), so another user cannot
reach it; these tests swap a chunk the way only the victim (or root, or a disk) could, and check
that the swapped bytes are never served or written out.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from monarch_rdmafs.errors import CorruptChunk
from monarch_rdmafs.manifest import DIR, FILE, LINK, Entry, Manifest, chunk_id
from monarch_rdmafs.mount import FuseMount, MaterializedMount
from monarch_rdmafs.store import ChunkStore
from tests.rdmafs.conftest import fuse  # noqa: F401  (fixture)


def _swap(store: ChunkStore, cid: str, data: bytes) -> None:
    path = store.path(cid)
    os.chmod(path, 0o600)
    with open(path, "wb") as f:
        f.write(data)


def _tree(store: ChunkStore) -> tuple[Manifest, str]:
    code = b"print('the real code')\n"
    cid = chunk_id(code)
    store.put(cid, code)
    m = Manifest.build([Entry("", DIR, 0o755), Entry("x.py", FILE, 0o644, len(code), 1, (cid,))])
    store.put(m.id, m.data)
    return m, cid


def test_a_chunk_changed_on_disk_is_refused_and_dropped(tmp_path):
    store = ChunkStore(str(tmp_path / "store"))
    _, cid = _tree(store)
    reader = ChunkStore(store.root)  # another process (the mount process) reading the same store
    _swap(store, cid, b"import os; os.system('evil')\n")
    with pytest.raises(CorruptChunk, match="does not match its hash"):
        reader.get(cid)
    assert not reader.has(cid)  # dropped: the next sync sends it again
    _tree(store)
    _swap(store, cid, b"import os; os.system('evil')\n")
    with pytest.raises(CorruptChunk):
        ChunkStore(store.root).read_fd(cid)


def test_a_materialized_tree_never_holds_swapped_bytes(tmp_path):
    store = ChunkStore(str(tmp_path / "store"))
    m, cid = _tree(store)
    _swap(store, cid, b"import os; os.system('evil')\n")
    mnt = MaterializedMount(ChunkStore(store.root), str(tmp_path / "mnt"))
    with pytest.raises(CorruptChunk):
        mnt.start(m.id)
    assert not os.path.exists(os.path.join(str(tmp_path / "mnt"), "x.py"))


def test_a_fuse_mount_answers_eio_for_swapped_bytes(tmp_path, fuse):  # noqa: F811
    store = ChunkStore(str(tmp_path / "store"))
    m, cid = _tree(store)
    _swap(store, cid, b"import os; os.system('evil')\n")
    mnt = FuseMount(store, str(tmp_path / "mnt"))
    mnt.start(m.id)
    try:
        with pytest.raises(OSError) as e:
            with open(os.path.join(mnt.mountpoint, "x.py"), "rb") as f:
                f.read()
        assert e.value.errno == errno.EIO
    finally:
        mnt.stop()


def _manifest(rows) -> bytes:
    return json.dumps({"format": "monarch-rdmafs-manifest", "version": 1,
                       "entries": [["", DIR, 0o755, 0, 0, ""], *rows]}).encode()


CID = "0" * 32


@pytest.mark.parametrize("rows, why", [
    ([["/etc/cron.d/x", FILE, 0o644, 1, 0, [CID]]], "not a plain relative path"),
    ([["../../.bashrc", FILE, 0o644, 1, 0, [CID]]], "not a plain relative path"),
    ([["a/./b", FILE, 0o644, 1, 0, [CID]]], "not a plain relative path"),
    ([["a", LINK, 0o777, 0, 0, "/home"], ["a/b", FILE, 0o644, 1, 0, [CID]]], "not inside a directory"),
    ([["x", FILE, 0o644, 1, 0, ["../../../etc/passwd"]]], "bad chunk ids"),
    ([["x", FILE, 0o644, 1, 0, [CID, CID]]], "size that does not match"),
    ([["b", FILE, 0o644, 1, 0, [CID]], ["a", FILE, 0o644, 1, 0, [CID]]], "out of order"),
])
def test_a_manifest_naming_a_path_outside_its_tree_is_refused(rows, why):
    with pytest.raises(ValueError, match=why):
        Manifest.from_bytes(_manifest(rows))


def test_a_chunk_id_that_is_a_path_is_never_joined_to_one(tmp_path):
    store = ChunkStore(str(tmp_path / "store"))
    assert not store.has("../../etc/passwd")
    with pytest.raises(CorruptChunk):
        store.put("../../x", b"x")


def test_a_workspace_is_not_mounted_where_another_user_could_swap_it(attacker, shared, tmp_path):
    """`remotemount(mesh, src, "/tmp/project")`: a folder another user made first is refused."""
    from monarch_rdmafs.private import UnsafeFolder

    store = ChunkStore(str(tmp_path / "store"))
    m, _ = _tree(store)
    theirs = os.path.join(shared, "project")
    attacker.run(f"mkdir -m 777 {theirs}")
    for mount in (MaterializedMount(store, os.path.join(theirs, "mnt")),):
        with pytest.raises(UnsafeFolder, match="belongs to another user"):
            mount.start(m.id)
    # In a sticky shared folder (as /tmp) a mount point of one's own is fine.
    mine = MaterializedMount(store, os.path.join(shared, "mine"))
    mine.start(m.id)
    try:
        with open(os.path.join(shared, "mine", "x.py"), "rb") as f:
            assert f.read() == b"print('the real code')\n"
    finally:
        mine.stop()


def _packed_tree(store: ChunkStore) -> tuple[Manifest, str, str]:
    """A tree whose file and manifest are packed together (as a sync stores them); (manifest, chunk, pack path)."""
    code = b"print('the real code')\n"
    cid = chunk_id(code)
    m = Manifest.build([Entry("", DIR, 0o755), Entry("x.py", FILE, 0o644, len(code), 1, (cid,))])
    store.put_many([(cid, code), (m.id, m.data)])
    packs = os.path.join(store.root, "packs")
    (name,) = os.listdir(packs)
    return m, cid, os.path.join(packs, name)


def _rewrite(path: str, change) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    os.chmod(path, 0o600)
    with open(path, "wb") as f:
        f.write(change(data))


def test_a_swapped_byte_in_a_pack_is_refused_and_the_pack_dropped(tmp_path):
    store = ChunkStore(str(tmp_path / "store"))
    _, cid, pack = _packed_tree(store)
    _rewrite(pack, lambda d: d.replace(b"real", b"evil"))
    reader = ChunkStore(store.root)
    with pytest.raises(CorruptChunk, match="does not match its hash"):
        reader.get(cid)
    assert not reader.has(cid) and not os.path.exists(pack)  # the next sync sends it again
    assert store.missing([cid]) == [cid], "the writer (the agent) learns it is gone, and asks for it again"


def test_a_truncated_pack_serves_nothing(tmp_path):
    store = ChunkStore(str(tmp_path / "store"))
    _, cid, pack = _packed_tree(store)
    _rewrite(pack, lambda d: d[:10])
    reader = ChunkStore(store.root)
    assert not reader.has(cid)
    with pytest.raises(OSError):
        reader.get(cid)


def test_a_pack_index_pointing_at_other_bytes_is_refused(tmp_path):
    """An index rewritten to give one chunk's id another chunk's place: the hash check catches it."""
    import struct

    store = ChunkStore(str(tmp_path / "store"))
    m, cid, pack = _packed_tree(store)

    def swap_places(d: bytearray) -> bytearray:
        n = struct.unpack_from("<Q", d, len(d) - 8)[0]
        start = len(d) - 16 - 32 * n
        e = [bytes(d[start + 32 * i:start + 32 * (i + 1)]) for i in range(n)]
        e = [a[:16] + b[16:] for a, b in zip(e, e[::-1])]
        d[start:start + 32 * n] = b"".join(e)
        return d

    _rewrite(pack, swap_places)
    with pytest.raises(CorruptChunk):
        ChunkStore(store.root).get(cid)


def test_a_fuse_mount_answers_eio_for_swapped_bytes_in_a_pack(tmp_path, fuse):  # noqa: F811
    store = ChunkStore(str(tmp_path / "store"))
    m, cid, pack = _packed_tree(store)
    mnt = FuseMount(store, str(tmp_path / "mnt"))
    mnt.start(m.id)
    try:
        _rewrite(pack, lambda d: d.replace(b"real", b"evil"))
        with pytest.raises(OSError) as e:
            with open(os.path.join(mnt.mountpoint, "x.py"), "rb") as f:
                f.read()
        assert e.value.errno == errno.EIO
    finally:
        mnt.stop()
