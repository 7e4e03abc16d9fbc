"""Packing a workspace: manifest fields, ignore files, chunking, the stat cache, links, bad input."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from monarch_rdmafs.errors import SourceChanged, WorkspaceUnreadable
from monarch_rdmafs.manifest import CHUNK_SIZE, DIR, FILE, LINK, Manifest, chunk_id
from monarch_rdmafs.pack import Packer
from tests.rdmafs.conftest import make_tree


def test_manifest_records_paths_modes_sizes_mtimes_links_and_chunks(tmp_path):
    make_tree(tmp_path)
    r = Packer(str(tmp_path)).pack()
    by = r.manifest.by_path()
    assert by[""].kind == DIR
    assert by["train.py"].kind == FILE and by["train.py"].size == len("print('train v1')\n")
    assert by["train.py"].mtime_ns == os.stat(tmp_path / "train.py").st_mtime_ns
    assert stat.S_IMODE(os.stat(tmp_path / "run.sh").st_mode) == by["run.sh"].mode == 0o755
    assert by["pkg/sub"].kind == DIR
    assert by["inside_link"].kind == LINK and by["inside_link"].target == "pkg/sub/data.txt"
    assert by["big.bin"].size == 9 << 20 and len(by["big.bin"].chunks) == 3
    assert by["train.py"].chunks == (chunk_id(b"print('train v1')\n"),)
    # The manifest survives its own bytes, and its id is their hash.
    again = Manifest.from_bytes(r.manifest.data)
    assert again.entries == r.manifest.entries and again.id == chunk_id(r.manifest.data)
    # Every chunk can be read back as packed.
    for cid, src in r.sources.items():
        assert chunk_id(Packer(str(tmp_path)).read_chunk(cid, src)) == cid


def test_gitignore_and_monarchignore_in_every_folder(tmp_path):
    make_tree(tmp_path)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / ".monarch").mkdir()
    (tmp_path / ".monarch" / "job_state.pkl").write_text("x")
    (tmp_path / "pkg" / ".gitignore").write_text("*.txt\n")
    (tmp_path / ".monarchignore").write_text("!keep.log\nsecret/\n")
    (tmp_path / "keep.log").write_text("kept\n")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("k")
    paths = set(Packer(str(tmp_path)).pack().manifest.by_path())
    assert "build" not in paths and "build/out.o" not in paths and "debug.log" not in paths
    assert "keep.log" in paths, ".monarchignore's '!' brings back what .gitignore ignores"
    assert "secret" not in paths
    assert "pkg/sub/data.txt" not in paths, "a nested .gitignore applies below its folder"
    assert not any(p.startswith((".git/", ".monarch/")) or p in (".git", ".monarch") for p in paths)
    assert {"train.py", "pkg/__init__.py", ".gitignore"} <= paths
    # Without ignores (an environment folder), everything but .git/.monarch is packed.
    assert "build/out.o" in set(Packer(str(tmp_path), honour_ignores=False).pack().manifest.by_path())


def test_edit_inside_a_large_file_changes_only_its_chunk(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * CHUNK_SIZE + 100))
    p = Packer(str(tmp_path))
    first = p.pack().manifest.by_path()["big.bin"].chunks
    with open(big, "r+b") as f:
        f.seek(CHUNK_SIZE + 5)
        f.write(b"edited")
    second = p.pack().manifest.by_path()["big.bin"].chunks
    assert len(first) == len(second) == 4
    assert [a == b for a, b in zip(first, second)] == [True, False, True, True]


def test_unchanged_files_are_not_read_again(tmp_path):
    make_tree(tmp_path)
    p = Packer(str(tmp_path))
    assert p.pack().rehashed >= 6
    assert p.pack().rehashed == 0
    (tmp_path / "train.py").write_text("print('train v2')\n")
    r = p.pack()
    assert r.rehashed == 1 and r.manifest.by_path()["train.py"].chunks == (chunk_id(b"print('train v2')\n"),)


def test_links_out_of_the_workspace_are_kept_as_links_and_never_followed(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private.txt").write_text("not to be synced")
    os.symlink(str(outside), ws / "dir_link")
    os.symlink("../outside/private.txt", ws / "file_link")
    r = Packer(str(ws)).pack()
    by = r.manifest.by_path()
    assert by["dir_link"].kind == LINK and by["dir_link"].target == str(outside)
    assert by["file_link"].kind == LINK and by["file_link"].target == "../outside/private.txt"
    assert not any("private" in p for p in by if p != "file_link")
    assert all(src.path.startswith(str(ws)) for src in r.sources.values())


def test_missing_or_non_directory_workspace_is_one_line_naming_it(tmp_path):
    with pytest.raises(WorkspaceUnreadable) as e:
        Packer(str(tmp_path / "nope")).pack()
    assert str(tmp_path / "nope") in e.value.message and "does not exist" in e.value.message
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkspaceUnreadable) as e:
        Packer(str(tmp_path / "file")).pack()
    assert "not a directory" in e.value.message


def test_special_files_are_listed_as_skipped(tmp_path):
    (tmp_path / "a.py").write_text("x")
    os.mkfifo(tmp_path / "pipe")
    r = Packer(str(tmp_path)).pack()
    assert "pipe" not in r.manifest.by_path()
    assert [p for p, _ in r.skipped] == ["pipe"]


def _as_nobody(fn):
    """Run ``fn()`` in a child process as user nobody (root reads everything); returns what it returned or raised."""
    import pickle

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                out = ("ok", fn())
            except Exception as e:
                out = ("err", (type(e).__name__, getattr(e, "message", str(e))))
            os.write(w, pickle.dumps(out))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the packer as another user")
def test_unreadable_files_are_skipped_or_refused_as_asked():
    base = tempfile.mkdtemp(prefix="monarch-unreadable-")
    try:
        os.chmod(base, 0o755)
        (ws := os.path.join(base, "ws")) and os.mkdir(ws)
        os.chmod(ws, 0o755)
        for name, mode in (("ok.py", 0o644), ("secret.key", 0o600)):
            with open(os.path.join(ws, name), "w") as f:
                f.write(name)
            os.chmod(os.path.join(ws, name), mode)
        os.mkdir(os.path.join(ws, "closed"), 0o700)
        kind, value = _as_nobody(lambda: (sorted(Packer(ws).pack().manifest.by_path()), Packer(ws).pack().skipped))
        assert kind == "ok"
        paths, skipped = value
        assert "ok.py" in paths and "secret.key" not in paths and "closed" not in paths
        assert sorted(p for p, _ in skipped) == ["closed/", "secret.key"]
        assert all(why == "permission denied" for _, why in skipped)
        kind, (cls, message) = _as_nobody(lambda: Packer(ws, unreadable="fail").pack())
        assert kind == "err" and cls == "WorkspaceUnreadable"
        assert "cannot read closed/" in message and "1 more" in message
        kind, (cls, message) = _as_nobody(lambda: Packer(os.path.join(ws, "closed")).pack())
        assert cls == "WorkspaceUnreadable" and "closed" in message and "permission denied" in message
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_a_file_changing_while_read_is_never_packed_torn(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "log.bin"
    f.write_bytes(b"x" * (CHUNK_SIZE + 10))
    writer = subprocess.Popen([sys.executable, "-c", f"""
import os
with open({str(f)!r}, 'ab') as out:
    while True:
        out.write(b'y' * 4096); out.flush()
"""])
    try:
        for _ in range(5):
            try:
                r = Packer(str(tmp_path)).pack()
            except SourceChanged as e:  # it kept changing: refused, never half-read
                assert "log.bin kept changing" in e.message
                continue
            # Or a consistent snapshot: the file only grows, so its first `size` bytes are what was packed.
            entry = r.manifest.by_path()["log.bin"]
            with open(f, "rb") as g:
                prefix = g.read(entry.size)
            chunks = tuple(chunk_id(prefix[i:i + CHUNK_SIZE]) for i in range(0, entry.size, CHUNK_SIZE))
            assert chunks == entry.chunks
    finally:
        writer.kill()
        writer.wait()
    # Packed, then changed before its chunks were sent: reading them again says so.
    p = Packer(str(tmp_path))
    r = p.pack()
    cid, src = next(iter(r.sources.items()))
    f.write_bytes(b"z" * (CHUNK_SIZE + 10))
    with pytest.raises(SourceChanged):
        p.read_chunk(cid, src)


def test_public_names():
    import monarch_rdmafs

    assert monarch_rdmafs.__all__ == sorted([
        "CHUNK_SIZE", "ChunkSource", "ChunkStore", "CorruptChunk", "Entry", "FuseMount", "Manifest",
        "MaterializedMount", "PackResult", "Packer", "SourceChanged", "StoreFull", "SyncError", "TransportChoice",
        "WorkspaceService", "WorkspaceUnreadable", "choose_transport", "chunk_id", "fuse_unavailable_reason",
        "unmount_stale"])
    for name in monarch_rdmafs.__all__:
        assert getattr(monarch_rdmafs, name) is not None
