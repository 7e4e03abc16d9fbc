"""write_atomic: the old file or the new one, never half, on a full disk and under concurrent writers."""

from __future__ import annotations

import errno
import os
import subprocess
import threading

import pytest

from monarch_agents.files import write_atomic


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (root only), unmounted however the test ends."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(tiny_disk):
    path = tiny_disk / "job_state.pkl"
    write_atomic(str(path), b"old state " * 100)
    fd = os.open(tiny_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:  # fill what is left
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    with pytest.raises(OSError) as info:
        write_atomic(str(path), b"new state " * 50_000)  # 500 KB: more than the whole disk
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)  # names the file, not the temporary
    assert path.read_bytes() == b"old state " * 100
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler", "job_state.pkl"]
    assert (path.stat().st_mode & 0o777) == 0o600


def test_concurrent_writers_of_one_path_each_write_whole(tmp_path):
    """Two threads of one process writing the same file (a rank's exit file and a retry, say): with a
    temporary named by pid they shared it and one failed or renamed the other's half."""
    path = tmp_path / "f.json"
    errors: list[BaseException] = []

    def writer(tag: bytes) -> None:
        try:
            for _ in range(300):
                write_atomic(str(path), tag * 10_000, durable=False)
        except BaseException as e:  # noqa: BLE001  (collected, asserted below)
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in (b"a", b"b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_bytes() in (b"a" * 10_000, b"b" * 10_000)
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_missing_folder_is_made_and_a_refused_one_names_the_file(tmp_path):
    write_atomic(str(tmp_path / "a" / "b" / "f"), b"x")
    assert (tmp_path / "a" / "b" / "f").read_bytes() == b"x"
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(OSError) as info:
        write_atomic(str(tmp_path / "file" / "f"), b"x")
    assert info.value.filename == str(tmp_path / "file" / "f")
