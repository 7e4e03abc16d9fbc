"""monarch.remotemount's index and blocks (Monarch's build_index / materialise_block / code_blocks):
what is packed where, what a refresh moves, what a changed file becomes; the mounts themselves are
tests/rdmafs/test_blockfs.py, tests/rdmafs/test_sync_e2e.py (four hosts, $SUBDIR) and
tests/compat/remote_mount.py (this host, the same output on torchmonarch 0.7.0)."""

from __future__ import annotations

import os

import pytest

from monarch.remotemount.remotemount import (
    BIG_FILE_THRESHOLD,
    BLOCK_SIZE,
    build_index,
    code_blocks,
    materialise_block,
)
from monarch_rdmafs.mount import fuse_unavailable_reason


def _write(path, data: bytes, bump_ns: int = 0) -> None:
    with open(path, "wb") as f:
        f.write(data)
    if bump_ns:
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump_ns))


def test_small_files_come_first_then_big_ones_and_the_job_state_is_left_out(tmp_path):
    _write(tmp_path / "big.bin", b"b" * BIG_FILE_THRESHOLD)
    (tmp_path / "pkg").mkdir()
    _write(tmp_path / "pkg" / "m.py", b"x = 1\n")
    (tmp_path / ".monarch").mkdir()
    _write(tmp_path / ".monarch" / "state", b"s")
    index = build_index(str(tmp_path), {})
    assert sorted(index) == ["/", "/big.bin", "/pkg", "/pkg/m.py"]
    assert index["/pkg/m.py"]["global_offset"] == 0 and index["/big.bin"]["global_offset"] == 6
    assert index["/"]["total_size"] == 6 + BIG_FILE_THRESHOLD
    assert code_blocks(index) == {0}
    assert build_index(str(tmp_path), index) == index  # nothing changed: equal (refresh ships nothing)


def test_a_change_is_appended_in_a_new_block_and_nothing_else_moves(tmp_path):
    for i in range(5):
        _write(tmp_path / f"f{i}", bytes([i]) * 100)
    first = build_index(str(tmp_path), {})
    _write(tmp_path / "f2", b"new" * 10, bump_ns=10**6)
    _write(tmp_path / "f9", b"added")
    second = build_index(str(tmp_path), first)
    moved = sorted(v for v in first if "global_offset" in first[v]
                   and second[v]["global_offset"] != first[v]["global_offset"])
    assert moved == ["/f2"]
    assert {second["/f2"]["global_offset"], second["/f9"]["global_offset"]} == {BLOCK_SIZE, BLOCK_SIZE + 30}
    assert second["/"]["total_size"] == BLOCK_SIZE + 35
    (tmp_path / "f9").unlink()
    third = build_index(str(tmp_path), second)
    assert "/f9" not in third and third["/"]["total_size"] == second["/"]["total_size"]


def test_a_file_changed_after_its_index_is_random_bytes_and_named(tmp_path):
    _write(tmp_path / "a", b"a" * 1000)
    _write(tmp_path / "b", b"b" * 1000)
    index = build_index(str(tmp_path), {})
    _write(tmp_path / "b", b"B" * 1000, bump_ns=10**6)
    data, used, diverged = materialise_block(index, 0, bytearray(BLOCK_SIZE))
    assert diverged == ["/b"] and used == 2000 and len(data) == BLOCK_SIZE
    off_a, off_b = index["/a"]["global_offset"], index["/b"]["global_offset"]
    assert data[off_a:off_a + 1000] == b"a" * 1000
    assert data[off_b:off_b + 1000] not in (b"b" * 1000, b"B" * 1000)
    (tmp_path / "a").unlink()
    assert materialise_block(index, 0, bytearray(BLOCK_SIZE))[2] == ["/a", "/b"]
    with pytest.raises(ValueError, match="beyond the packed data"):
        materialise_block(index, 1, bytearray(BLOCK_SIZE))


@pytest.mark.skipif(bool(fuse_unavailable_reason()), reason=fuse_unavailable_reason() or "")
def test_a_mount_inside_the_source_is_an_empty_folder_and_never_read_through(tmp_path):
    from monarch_rdmafs.blockmount import BlockMount

    _write(tmp_path / "code.py", b"pass\n")
    inner = tmp_path / "inner"
    inner.mkdir()
    m = BlockMount({"/": {"attr": {"st_mode": 0o40755}, "children": ["x"]},
                    "/x": {"attr": {"st_mode": 0o100644}, "global_offset": 0, "file_len": 1}}, 1, str(inner))
    try:
        index = build_index(str(tmp_path), {})
        assert index["/inner"]["children"] == [] and "/inner/x" not in index
        assert index["/"]["children"] == ["code.py", "inner"]
    finally:
        m.unmount()


_KILLED_OWNER = """
import os, sys
from monarch.actor import this_host
from monarch.remotemount import remotemount
rm = remotemount(this_host(), sys.argv[1], sys.argv[2])
rm.open()
print(open(os.path.join(sys.argv[2], "a.py")).read(), flush=True)
os.kill(os.getpid(), 9)
"""


@pytest.mark.skipif(bool(fuse_unavailable_reason()), reason=fuse_unavailable_reason() or "")
def test_a_client_killed_with_its_mount_open_leaves_no_mount_and_no_process(tmp_path, no_leaked_processes):
    import subprocess
    import sys
    import time

    from monarch_rdmafs.mount import is_mounted
    from tests.helpers import ROOT

    (tmp_path / "src").mkdir()
    _write(tmp_path / "src" / "a.py", b"A = 1\n")
    mnt = str(tmp_path / "mnt")
    r = subprocess.run([sys.executable, "-c", _KILLED_OWNER, str(tmp_path / "src"), mnt], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == -9 and r.stdout == "A = 1\n\n", r.stderr[-2000:]
    deadline = time.monotonic() + 30
    while is_mounted(mnt) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_mounted(mnt)
