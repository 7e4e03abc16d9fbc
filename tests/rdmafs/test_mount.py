"""The read-only mount (real FUSE) and its fallback: contents, EROFS, atomic switches, dead mounts."""

from __future__ import annotations

import errno
import os
import signal
import stat
import time

import pytest

from monarch_rdmafs.manifest import Manifest
from monarch_rdmafs.mount import FuseMount, MaterializedMount, is_mounted, mounts_of, unmount_stale
from monarch_rdmafs.pack import Packer
from monarch_rdmafs.store import ChunkStore
from tests.helpers import wait_gone
from tests.rdmafs.conftest import make_tree


def publish(store: ChunkStore, packer: Packer) -> Manifest:
    """Pack the tree and put every chunk (and the manifest) into the store, as a sync would."""
    r = packer.pack()
    for cid in store.missing(r.sources):
        store.put(cid, packer.read_chunk(cid, r.sources[cid]))
    store.put(r.manifest.id, r.manifest.data)
    return r.manifest


@pytest.fixture
def tree(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    make_tree(ws)
    store = ChunkStore(str(tmp_path / "store"))
    return ws, store, Packer(str(ws))


@pytest.fixture
def fuse_mount(fuse, tree, tmp_path):
    ws, store, packer = tree
    m = FuseMount(store, str(tmp_path / "mnt"))
    m.start(publish(store, packer).id)
    try:
        yield m
    finally:
        m.stop()
    assert not is_mounted(m.mountpoint)


def _same_tree(ws, mnt, mode_mask: int = 0o7777) -> None:
    for rel in ("train.py", "pkg/__init__.py", "pkg/sub/data.txt", "run.sh", "big.bin"):
        a, b = os.path.join(ws, rel), os.path.join(mnt, rel)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read(), rel
        sa, sb = os.stat(a), os.stat(b)
        assert (sa.st_size, sa.st_mtime_ns, stat.S_IMODE(sa.st_mode) & mode_mask) == \
            (sb.st_size, sb.st_mtime_ns, stat.S_IMODE(sb.st_mode) & mode_mask)
    assert sorted(os.listdir(mnt)) == sorted(n for n in os.listdir(ws) if n not in ("build", "debug.log"))
    assert os.readlink(os.path.join(mnt, "outside_link")) == "/etc"
    assert os.readlink(os.path.join(mnt, "inside_link")) == "pkg/sub/data.txt"
    with open(os.path.join(mnt, "inside_link")) as f:
        assert f.read() == "data\n"


def test_fuse_mount_serves_the_tree_read_only(tree, fuse_mount):
    ws, _, _ = tree
    mnt = fuse_mount.mountpoint
    _same_tree(ws, mnt)
    with open(os.path.join(mnt, "big.bin"), "rb") as f:  # reads across chunk boundaries
        f.seek((4 << 20) - 10)
        assert f.read(20) == (ws / "big.bin").read_bytes()[(4 << 20) - 10:(4 << 20) + 10]
    for attempt in (lambda: open(os.path.join(mnt, "train.py"), "w"),
                    lambda: open(os.path.join(mnt, "new.py"), "w"),
                    lambda: os.mkdir(os.path.join(mnt, "d")),
                    lambda: os.unlink(os.path.join(mnt, "train.py")),
                    lambda: os.rename(os.path.join(mnt, "train.py"), os.path.join(mnt, "x.py"))):
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    assert mounts_of(fuse_mount.store.root) == [mnt]


def test_a_switch_is_atomic_and_open_files_keep_their_bytes(tree, fuse_mount):
    ws, store, packer = tree
    mnt = fuse_mount.mountpoint
    old = open(os.path.join(mnt, "train.py"))
    assert os.listdir(os.path.join(mnt, "pkg", "sub")) == ["data.txt"]
    (ws / "train.py").write_text("print('train v2')\n")
    (ws / "pkg" / "sub" / "data.txt").unlink()
    (ws / "pkg" / "sub" / "new.txt").write_text("new\n")
    big = bytearray((ws / "big.bin").read_bytes())
    big[5 << 20] ^= 1
    (ws / "big.bin").write_bytes(bytes(big))
    fuse_mount.switch(publish(store, packer).id)
    # Visible at once (the kernel's cached names were invalidated), whole files only.
    with open(os.path.join(mnt, "train.py")) as f:
        assert f.read() == "print('train v2')\n"
    assert os.listdir(os.path.join(mnt, "pkg", "sub")) == ["new.txt"]
    assert not os.path.exists(os.path.join(mnt, "pkg", "sub", "data.txt"))
    with open(os.path.join(mnt, "big.bin"), "rb") as f:
        assert f.read() == bytes(big)
    assert old.read() == "print('train v1')\n", "a file open before the switch keeps its bytes"
    old.close()


def test_kill_9_of_the_mount_process_leaves_a_dead_mount_that_is_cleared(tree, fuse, tmp_path):
    ws, store, packer = tree
    m = FuseMount(store, str(tmp_path / "mnt"))
    m.start(publish(store, packer).id)
    try:
        os.kill(m.proc.pid, signal.SIGKILL)
        assert wait_gone([m.proc.pid]) == []
        m.proc.wait()
        assert is_mounted(m.mountpoint)  # dead, but still in the mount table
        assert unmount_stale(store.root) == [m.mountpoint]
        assert not is_mounted(m.mountpoint) and mounts_of(store.root) == []
        m.start(m_id := publish(store, packer).id)  # and the place can be mounted again
        assert os.path.exists(os.path.join(m.mountpoint, "train.py")) and m_id
    finally:
        m.stop()


def test_the_mount_process_unmounts_when_its_parent_dies(tree, fuse, tmp_path):
    import subprocess
    import sys

    ws, store, packer = tree
    mid = publish(store, packer).id
    mnt = str(tmp_path / "mnt")
    os.makedirs(mnt)
    # A parent that starts the mount process and is then killed with -9.
    parent = subprocess.Popen([sys.executable, "-c", f"""
import subprocess, sys, time
p = subprocess.Popen([sys.executable, '-m', 'monarch_rdmafs.mount', '--store', {store.root!r}, '--manifest', {mid!r}, {mnt!r}],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
print(p.pid, p.stdout.readline().decode().strip(), flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    try:
        pid, ready = parent.stdout.readline().split()
        assert ready == "ready" and is_mounted(mnt)
        parent.kill()
        parent.wait()
        assert wait_gone([int(pid)]) == []
        assert not is_mounted(mnt)
    finally:
        parent.kill()
        parent.wait()
        unmount_stale(store.root)


def test_materialized_fallback_switches_a_read_only_directory(tree, tmp_path):
    ws, store, packer = tree
    m = MaterializedMount(store, str(tmp_path / "mnt"))
    m.start(publish(store, packer).id)
    try:
        mnt = m.mountpoint
        _same_tree(ws, mnt, mode_mask=0o7555)  # files are written read-only
        assert os.stat(os.path.join(mnt, "train.py")).st_mode & 0o222 == 0
        first = os.path.realpath(mnt)
        (ws / "train.py").write_text("print('train v2')\n")
        m.switch(publish(store, packer).id)
        with open(os.path.join(mnt, "train.py")) as f:
            assert f.read() == "print('train v2')\n"
        assert os.path.realpath(mnt) != first and os.path.isdir(first), "the previous generation is kept"
    finally:
        m.stop()
    assert not os.path.lexists(m.mountpoint)


def test_a_mount_reads_ahead_whole_chunks(fuse_mount):
    """The kernel asks for 1 MiB reads, a chunk ahead (root may set it; the default 128 KiB made
    every big read 8x as many requests)."""
    from monarch_rdmafs.mount import READAHEAD_KB

    if os.geteuid() != 0:
        pytest.skip("only root may set a mount's read-ahead")
    with open(os.path.join(fuse_mount.mountpoint, "big.bin"), "rb") as f:  # the first open sets it
        assert f.read(1)
    st = os.stat(fuse_mount.mountpoint)
    with open(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb") as f:
        assert int(f.read()) == READAHEAD_KB


def test_reads_across_chunks_at_any_offset_and_at_once_get_the_right_bytes(tree, fuse_mount):
    """Chunks are mapped and checked on threads, read ahead, and replies come from the mappings: the
    bytes are right at any offset, across chunk boundaries, from several readers at once, and again
    once the kernel's cache of the file is dropped (every request then reaches the mount)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    from monarch_rdmafs.manifest import CHUNK_SIZE

    ws, _, _ = tree
    with open(os.path.join(ws, "big.bin"), "rb") as f:
        want = f.read()
    path = os.path.join(fuse_mount.mountpoint, "big.bin")
    rng = random.Random(7)
    spans = [(CHUNK_SIZE - 5, 10), (2 * CHUNK_SIZE - (1 << 20), 2 << 20), (0, len(want)), (len(want) - 3, 100)]
    spans += [(rng.randrange(len(want)), rng.randrange(1, 3 << 20)) for _ in range(40)]

    def read(span: tuple[int, int]) -> bool:
        off, n = span
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, n, off) == want[off:off + n]
        finally:
            os.close(fd)

    for _ in range(2):
        with ThreadPoolExecutor(4) as ex:
            assert all(ex.map(read, spans))
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the next round asks the mount again
        os.close(fd)


def test_a_mount_started_ahead_serves_what_it_is_given_later(fuse, tree, tmp_path):
    """FuseMount.warm: the process starts before the manifest exists (a sync's transfer runs meanwhile)."""
    ws, store, packer = tree
    warm = FuseMount.warm(store)
    manifest = publish(store, packer)
    m = FuseMount(store, str(tmp_path / "mnt"))
    m.start(manifest.id, warm)
    try:
        assert m.proc is warm
        _same_tree(ws, m.mountpoint)
    finally:
        m.stop()
    assert not is_mounted(m.mountpoint)


def test_a_mount_started_ahead_and_never_used_ends_without_mounting(fuse, tree):
    _, store, _ = tree
    warm = FuseMount.warm(store)
    pid = warm.pid
    assert warm.stop(time.monotonic() + 10) == 0
    assert wait_gone([pid]) == []


def test_a_chunk_corrupt_in_its_segment_is_an_io_error_and_its_new_copy_is_served(fuse, tree, tmp_path):
    """Stored as a sync stores them (big chunks in a segment), one chunk of big.bin changed on disk:
    reading it through the mount is EIO, never other bytes; the agent's store then finds it missing,
    and once the next sync appended it again, the same mount serves the file whole."""
    ws, store, packer = tree
    r = packer.pack()
    store.put_many([(c, packer.read_chunk(c, r.sources[c])) for c in store.missing(r.sources)])
    store.put(r.manifest.id, r.manifest.data)
    cid = r.manifest.by_path()["big.bin"].chunks[1]
    good = packer.read_chunk(cid, r.sources[cid])
    reader = ChunkStore(store.root)
    reader.missing([cid])
    name, off, _ = reader._segged[cid]
    seg = os.path.join(store.root, "segs", name)
    os.chmod(seg, 0o600)
    with open(seg, "r+b") as f:
        f.seek(off + 4096)
        f.write(bytes([good[4096] ^ 0xFF]))
    with open(os.path.join(ws, "big.bin"), "rb") as f:
        want = f.read()
    m = FuseMount(store, str(tmp_path / "mnt"))
    m.start(r.manifest.id)
    try:
        path = os.path.join(m.mountpoint, "big.bin")
        with open(path, "rb", buffering=0) as f:
            assert f.read(1 << 20) == want[:1 << 20]
            with pytest.raises(OSError) as e:
                f.read()
            assert e.value.errno == errno.EIO
        assert store.missing(r.sources) == [cid], "the agent's store learns it from the segment's bad list"
        store.put_many([(cid, good)])  # what the next sync does
        with open(path, "rb") as f:
            assert f.read() == want
    finally:
        m.stop()
    assert not is_mounted(m.mountpoint)
