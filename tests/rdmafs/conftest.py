"""FUSE tests skip with the reason when FUSE cannot be used here; every mount a test makes is unmounted."""

from __future__ import annotations

import os
import subprocess

import pytest

from monarch_rdmafs.mount import SUBTYPE, fuse_unavailable_reason, unmount


@pytest.fixture(autouse=True)
def _every_test_cleans_up(no_leaked_processes):
    yield


@pytest.fixture
def fuse(tmp_path):
    """Skips the test (with why) where FUSE cannot be used; after it, no monarch-rdmafs mount of it is left.

    A mount is the test's if it or its store is under the test's folder (another test session on
    the machine may be mounting at the same time): tests keep their agents' stores there.
    """
    why = fuse_unavailable_reason()
    if why:
        pytest.skip(f"FUSE cannot be used here: {why}")
    before = set(_rdmafs_mounts())
    yield
    left = [mnt for fsname, mnt in _rdmafs_mounts() if (fsname, mnt) not in before
            and (mnt.startswith(str(tmp_path)) or fsname.startswith(str(tmp_path)))]
    for p in left:
        unmount(p)
    assert not left, f"test left mounts behind: {left}"


def _rdmafs_mounts() -> list[tuple[str, str]]:
    """(fsname, mount point) of every monarch-rdmafs mount."""
    with open("/proc/self/mounts") as f:
        return [(line.split()[0], line.split()[1]) for line in f if line.split()[2] == f"fuse.{SUBTYPE}"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MiB tmpfs (a real full disk), unmounted afterwards; skips where mounting needs root."""
    if os.getuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def make_tree(root) -> None:
    """A small workspace: code, a nested package, a 9 MiB binary, links in and out, ignore files."""
    root = str(root)
    os.makedirs(os.path.join(root, "pkg", "sub"), exist_ok=True)
    os.makedirs(os.path.join(root, "build"), exist_ok=True)
    with open(os.path.join(root, "train.py"), "w") as f:
        f.write("print('train v1')\n")
    with open(os.path.join(root, "pkg", "__init__.py"), "w") as f:
        f.write("VALUE = 1\n")
    with open(os.path.join(root, "pkg", "sub", "data.txt"), "w") as f:
        f.write("data\n")
    with open(os.path.join(root, "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho run\n")
    os.chmod(os.path.join(root, "run.sh"), 0o755)
    with open(os.path.join(root, "big.bin"), "wb") as f:
        f.write(os.urandom(9 << 20))
    with open(os.path.join(root, "build", "out.o"), "w") as f:
        f.write("ignored\n")
    with open(os.path.join(root, ".gitignore"), "w") as f:
        f.write("build/\n*.log\n")
    with open(os.path.join(root, "debug.log"), "w") as f:
        f.write("ignored\n")
    os.symlink("pkg/sub/data.txt", os.path.join(root, "inside_link"))
    os.symlink("/etc", os.path.join(root, "outside_link"))
