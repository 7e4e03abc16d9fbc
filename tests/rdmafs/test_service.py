"""The workspace service of a host, driven through its message handlers (real store, real FUSE mounts)."""

from __future__ import annotations

import os
import queue
import signal
import time

import pytest

from monarch_rdmafs import messages as wm
from monarch_rdmafs.mount import is_mounted, mounts_of
from monarch_rdmafs.pack import Packer
from monarch_rdmafs.service import WorkspaceService
from tests.helpers import wait_gone
from tests.rdmafs.conftest import make_tree

T = 30


class Host:
    """A service with its sends and replies recorded (what the agent's transport would carry)."""

    def __init__(self, root: str, rank: int = 0):
        self.sent: queue.Queue = queue.Queue()
        self.replies: queue.Queue = queue.Queue()
        self.svc = WorkspaceService(root, host=f"h{rank}", host_rank=rank,
                                    send=lambda addr, msg: self.sent.put((addr, msg)),
                                    reply=lambda port, value, ok: self.replies.put((port, value, ok)))
        self.handlers = self.svc.handlers()

    def ask(self, msg):
        self.handlers[type(msg)](msg)
        port, value, ok = self.replies.get(timeout=T)
        return value if ok else pytest.fail(f"service answered an error: {value}")

    def push(self, packer: Packer, forward=(), tamper=None):
        r = packer.pack()
        ids = [*r.sources, r.manifest.id]
        missing = self.ask(wm.WsMissing(ids, "port"))
        data = [r.manifest.data if c == r.manifest.id else packer.read_chunk(c, r.sources[c]) for c in missing]
        payload = b"".join(data)
        if tamper:
            payload = tamper(payload)
        done = self.ask(wm.WsChunks("s1", 0, missing, [len(d) for d in data], payload, list(forward), 2, "port"))
        return r, missing, done


@pytest.fixture
def host(tmp_path):
    h = Host(str(tmp_path / "host0"))
    yield h
    h.svc.stop(time.monotonic() + 10)


def test_missing_store_commit_and_status(fuse, host, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    make_tree(ws)
    packer = Packer(str(ws))
    r, missing, done = host.push(packer)
    assert done.stored == len(missing) == len(r.sources) + 1 and not done.corrupt and not done.error
    st = host.ask(wm.WsCommit("workspace", r.manifest.id, "", "", "port"))
    mnt = st["mountpoint"]
    assert st["mode"] == "fuse" and st["files"] == r.manifest.files and st["bytes"] == r.manifest.total_bytes
    assert open(os.path.join(mnt, "train.py")).read() == "print('train v1')\n"
    # A second sync of one edited file sends one chunk and the manifest.
    (ws / "train.py").write_text("print('train v2')\n")
    r2, missing2, _ = host.push(packer)
    assert len(missing2) == 2 and r2.manifest.id in missing2
    host.ask(wm.WsCommit("workspace", r2.manifest.id, "", "", "port"))
    assert open(os.path.join(mnt, "train.py")).read() == "print('train v2')\n"
    status = host.ask(wm.WsStatus("port"))
    assert status["transport"] == "tcp" and status["transport_reason"]
    assert status["mounts"][0]["syncs"] == 2 and status["mounts"][0]["alive"]
    assert host.ask(wm.WsUnmount("workspace", "port")) is True
    assert not is_mounted(mnt)


def test_a_batch_is_forwarded_down_the_tree_before_it_is_stored(host, tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.py").write_text("a")
    host.push(Packer(str(tmp_path / "ws")), forward=["h1", "h2", "h3", "h4"])
    got = [host.sent.get(timeout=T) for _ in range(2)]
    assert [(addr, msg.forward) for addr, msg in got] == [("h1", ["h2"]), ("h3", ["h4"])]
    assert all(bytes(m.payload) and m.ids for _, m in got)


def test_a_corrupted_chunk_is_reported_by_id_and_not_stored(host, tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.py").write_text("some code\n")

    def flip(payload: bytes) -> bytes:
        b = bytearray(payload)
        b[0] ^= 0xFF
        return bytes(b)

    r, missing, done = host.push(Packer(str(tmp_path / "ws")), tamper=flip)
    assert done.corrupt == [missing[0]] and done.stored == len(missing) - 1
    assert not host.svc.store.has(missing[0])


def test_a_full_disk_fails_the_batch_and_the_previous_generation_stays(fuse, tiny_disk, tmp_path):
    h = Host(str(tiny_disk / "host0"))
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "a.py").write_text("v1\n")
        packer = Packer(str(ws))
        r, _, done = h.push(packer)
        st = h.ask(wm.WsCommit("workspace", r.manifest.id, str(tmp_path / "mnt"), "", "port"))
        (ws / "big.bin").write_bytes(os.urandom(3 << 20))
        (ws / "a.py").write_text("v2\n")
        r2, _, done = h.push(packer)
        assert "no space left" in done.error
        h.handlers[wm.WsCommit](wm.WsCommit("workspace", r2.manifest.id, str(tmp_path / "mnt"), "", "port"))
        _, err, ok = h.replies.get(timeout=T)
        assert not ok and "never arrived" in str(err)
        assert open(os.path.join(st["mountpoint"], "a.py")).read() == "v1\n", "the previous generation is still served"
    finally:
        h.svc.stop(time.monotonic() + 10)


def test_a_killed_mount_process_is_unmounted_and_mounted_again(fuse, host, tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.py").write_text("a\n")
    r, _, _ = host.push(Packer(str(tmp_path / "ws")))
    st = host.ask(wm.WsCommit("workspace", r.manifest.id, "", "", "port"))
    server = host.svc.mounts["workspace"].server
    old_pid = server.proc.pid
    os.kill(old_pid, signal.SIGKILL)
    assert wait_gone([old_pid]) == []
    deadline = time.monotonic() + T
    while host.svc.mounts["workspace"].restarts == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host.svc.mounts["workspace"].restarts == 1 and server.proc.pid != old_pid
    assert open(os.path.join(st["mountpoint"], "a.py")).read() == "a\n"


def test_a_new_service_unmounts_what_a_killed_one_left(fuse, tmp_path):
    root = str(tmp_path / "host0")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.py").write_text("a\n")
    first = Host(root)
    r, _, _ = first.push(Packer(str(tmp_path / "ws")))
    st = first.ask(wm.WsCommit("workspace", r.manifest.id, "", "", "port"))
    # The agent is gone without stopping anything (kill -9), and its mount process with it.
    first.svc._stopping.set()
    proc = first.svc.mounts["workspace"].server.proc
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert is_mounted(st["mountpoint"])
    second = Host(root)
    try:
        assert second.svc.stale_unmounted == [st["mountpoint"]]
        assert mounts_of(second.svc.store.root) == []
    finally:
        second.svc.stop(time.monotonic() + 10)


def test_fallback_to_a_materialized_directory_is_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MONARCH_RDMAFS_NO_FUSE", "1")
    h = Host(str(tmp_path / "host0"))
    try:
        (tmp_path / "ws").mkdir()
        (tmp_path / "ws" / "a.py").write_text("a\n")
        r, _, _ = h.push(Packer(str(tmp_path / "ws")))
        st = h.ask(wm.WsCommit("workspace", r.manifest.id, "", "", "port"))
        assert st["mode"] == "materialized" and st["fallback_reason"] == "MONARCH_RDMAFS_NO_FUSE=1"
        assert open(os.path.join(st["mountpoint"], "a.py")).read() == "a\n"
        (tmp_path / "ws" / "a.py").write_text("b\n")
        r, _, _ = h.push(Packer(str(tmp_path / "ws")))
        h.ask(wm.WsCommit("workspace", r.manifest.id, "", "", "port"))
        assert open(os.path.join(st["mountpoint"], "a.py")).read() == "b\n"
        assert len([r for r in caplog.records if "materialized" in r.message]) == 1, "said once"
    finally:
        h.svc.stop(time.monotonic() + 10)
