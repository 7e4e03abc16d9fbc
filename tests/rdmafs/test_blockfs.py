"""The block mount of monarch.remotemount (monarch_rdmafs.blockfs + blockmount), through real FUSE:
reads wait for blocks and wake when they come, stale files read EIO, a refresh is seen through a
file opened before it, a file across two blocks, bad mount points, and no mount or process left
behind, also when the owner dies without unmounting."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from monarch_rdmafs.blockfs import BLOCK_SIZE
from monarch_rdmafs.blockmount import BlockMount
from monarch_rdmafs.mount import fuse_unavailable_reason, is_mounted
from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(bool(fuse_unavailable_reason()), reason=fuse_unavailable_reason() or "")


def _attr(mode: int, size: int = 0) -> dict:
    return {"st_atime": 1.5e9, "st_ctime": 1.5e9, "st_mtime": 1.5e9, "st_gid": os.getgid(), "st_uid": os.getuid(),
            "st_mode": mode, "st_nlink": 2 if mode & 0o40000 else 1, "st_size": size}


def _tree(files: dict[str, tuple[int, int]]) -> dict:
    """An index of files at the root: name -> (global_offset, length)."""
    index = {"/": {"attr": _attr(0o40755, 4096), "children": sorted(files)}}
    for name, (off, n) in files.items():
        index["/" + name] = {"attr": _attr(0o100644, n), "global_offset": off, "file_len": n}
    return index


def _publish(m: BlockMount, block: int, data: bytes, at: int = 0, stale: list[str] = ()) -> None:
    ctypes.memmove(m.block_ptr(block) + at, data, len(data))
    m.receive_block(block, list(stale))


def _read_in_thread(path: str) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            with open(path, "rb") as f:
                out["data"] = f.read()
        except OSError as e:
            out["errno"] = e.errno

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_read_waits_for_its_block_asks_for_it_once_and_wakes_when_it_comes(tmp_path):
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    asked: list[int] = []
    m = BlockMount(_tree({"a.txt": (0, 5)}), 5, mnt, asked.append)
    try:
        readers = [_read_in_thread(os.path.join(mnt, "a.txt")) for _ in range(3)]
        deadline = time.monotonic() + 30
        while not asked and time.monotonic() < deadline:
            time.sleep(0.02)
        assert asked == [0] and all(t.is_alive() for t, _ in readers)
        _publish(m, 0, b"hello")
        for t, out in readers:
            t.join(30)
            assert out == {"data": b"hello"}
        assert asked == [0]
        assert sorted(os.listdir(mnt)) == ["a.txt"]
    finally:
        m.unmount()
    assert not is_mounted(mnt)


def test_a_stale_file_reads_eio_and_its_neighbour_in_the_block_does_not(tmp_path):
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    m = BlockMount(_tree({"a": (0, 4), "b": (4, 4)}), 8, mnt)
    try:
        t, out = _read_in_thread(os.path.join(mnt, "b"))  # waiting when the stale block comes
        time.sleep(0.3)
        _publish(m, 0, b"goodjunk", stale=["/b"])
        t.join(30)
        assert out == {"errno": errno.EIO}
        with open(os.path.join(mnt, "a"), "rb") as f:
            assert f.read() == b"good"
        # Delivered again, not stale: it serves.
        _publish(m, 0, b"goodbbbb")
        with open(os.path.join(mnt, "b"), "rb") as f:
            assert f.read() == b"bbbb"
    finally:
        m.unmount()


def test_a_refresh_is_seen_through_a_file_opened_before_it_and_removed_names_go(tmp_path):
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    m = BlockMount(_tree({"f": (0, 4), "gone": (4, 1)}), 5, mnt)
    try:
        _publish(m, 0, b"AAAAx")
        fh = open(os.path.join(mnt, "f"), "rb")
        assert fh.read() == b"AAAA" and os.path.exists(os.path.join(mnt, "gone"))
        new = _tree({"f": (BLOCK_SIZE, 6)})  # appended: a new block, as build_index does
        m.refresh(new, BLOCK_SIZE + 6)
        _publish(m, 1, b"BBBBBB")
        fh.seek(0)
        assert fh.read() == b"BBBBBB"
        fh.close()
        assert os.stat(os.path.join(mnt, "f")).st_size == 6
        assert not os.path.exists(os.path.join(mnt, "gone")) and os.listdir(mnt) == ["f"]
    finally:
        m.unmount()


def test_a_file_across_two_blocks_reads_whole(tmp_path):
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    m = BlockMount(_tree({"f": (BLOCK_SIZE - 3, 6)}), BLOCK_SIZE + 3, mnt, lambda b: None)
    try:
        _publish(m, 0, b"abc", at=BLOCK_SIZE - 3)
        _publish(m, 1, b"def")
        with open(os.path.join(mnt, "f"), "rb") as f:
            assert f.read() == b"abcdef"
            f.seek(2)
            assert f.read(2) == b"cd"
        with pytest.raises(OSError) as e:
            open(os.path.join(mnt, "f"), "wb")
        assert e.value.errno == errno.EROFS
    finally:
        m.unmount()


def test_bad_mount_points_are_one_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="absolute path"):
        BlockMount(_tree({}), 0, "relative/mnt")
    with pytest.raises(RuntimeError, match="No such file"):
        BlockMount(_tree({}), 0, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="block_ptr"):
        os.mkdir(tmp_path / "m")
        m = BlockMount(_tree({}), 0, str(tmp_path / "m"))
        try:
            m.receive_block(0, [])
        finally:
            m.unmount()
    assert not is_mounted(str(tmp_path / "m"))


def test_an_owner_that_dies_without_unmounting_leaves_no_mount_and_no_process(tmp_path):
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    prog = textwrap.dedent(f"""
        import os, sys
        from monarch_rdmafs.blockmount import BlockMount
        m = BlockMount({{"/": {{"attr": {{"st_mode": 0o40755}}, "children": []}}}}, 0, {mnt!r})
        print(m._proc.pid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    pid = int(r.stdout.split()[0])
    deadline = time.monotonic() + 20
    while (is_mounted(mnt) or os.path.exists(f"/proc/{pid}")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_mounted(mnt) and not os.path.exists(f"/proc/{pid}")
