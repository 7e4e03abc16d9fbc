"""Syncs to real host agents: fan-out, edits, corruption in transit, an agent killed mid-transfer, a full disk."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from monarch.errors import WorkspaceError
from monarch._workbench.workspace import Target, WorkspacePusher
from monarch_agents.messages import Ping
from monarch_rdmafs.mount import is_mounted
from tests.helpers import start_client, start_host_agent, stop_client, wait_gone
from tests.rdmafs.conftest import make_tree

pytestmark = pytest.mark.timeout(120)
T = 30


@pytest.fixture(scope="module")
def client():
    rt = start_client()
    yield rt
    stop_client()


def start_agent(client, tmp_path, i: int, env: dict | None = None):
    """Host agent ``h<i>``, its workspace store under the test's folder (unless ``env`` puts it elsewhere)."""
    env = {"MONARCH_WORKSPACE_DIR": str(tmp_path / f"h{i}" / "ws"), **(env or {})}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        (tmp_path / f"h{i}").mkdir(exist_ok=True)
        return start_host_agent(client.keys, tmp_path / f"h{i}", hostname=f"h{i}")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_agents(client, tmp_path, n: int, env: dict | None = None) -> list:
    return [start_agent(client, tmp_path, i, env) for i in range(n)]


@pytest.fixture
def agents(client, tmp_path, fuse):
    started = start_agents(client, tmp_path, 4)
    yield started
    for a in started:
        a.stop()
    assert wait_gone([a.pid for a in started]) == []


def targets(agents) -> list[Target]:
    return [Target(a.addr, a.info["host"], i) for i, a in enumerate(agents)]


def workspace_of(client, agent) -> dict:
    return client.request(agent.addr, lambda port: Ping(port)).get(timeout=T).services["workspace"]


def test_sync_to_four_hosts_sends_each_byte_once_and_then_only_changes(client, agents, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    make_tree(ws)
    p = WorkspacePusher(client, str(ws), targets(agents), fanout=2)
    r = p.sync()
    total_chunks = len(r.mounts) and r.sent_chunks
    assert r.changed and r.files == 6 and total_chunks == 6 + 2 + 1  # 5 small + 3 chunks of big.bin + the manifest
    assert r.sent_bytes >= 9 << 20 and r.sent_bytes < (9 << 20) + 100_000, "the client sent each byte once"
    mounts = [m["mountpoint"] for m in r.mounts]
    assert len(set(mounts)) == 4
    for a, mnt in zip(agents, mounts):
        assert open(os.path.join(mnt, "train.py")).read() == "print('train v1')\n"
        assert open(os.path.join(mnt, "big.bin"), "rb").read() == (ws / "big.bin").read_bytes()
        st = workspace_of(client, a)
        # Each host received the bytes itself (forwarded down the tree), once.
        assert st["received_bytes"] == r.sent_bytes and st["transport"] == "tcp"
        assert st["mounts"][0]["files"] == 6 and st["mounts"][0]["mode"] == "fuse"
    (ws / "train.py").write_text("print('train v2')\n")
    asked = _count_questions(p)
    r2 = p.sync()
    assert (r2.sent_chunks, r2.changed) == (2, True)  # the edited file and the new manifest
    # An edit: no host asked which chunks it lacks first; its two small chunks go inside each host's
    # switch (through the tree of agents where there are enough hosts): one round.
    assert asked == {"WsCommit+chunks": 4}
    for mnt in mounts:
        assert open(os.path.join(mnt, "train.py")).read() == "print('train v2')\n"
    r3 = p.sync()
    assert (r3.sent_chunks, r3.changed) == (0, False)
    # A chain (fan-out 1) delivers the same way.
    (ws / "pkg" / "__init__.py").write_text("VALUE = 2\n")
    chain = WorkspacePusher(client, str(ws), targets(agents), fanout=1)
    assert chain.sync().sent_chunks == 2
    for mnt in mounts:
        assert open(os.path.join(mnt, "pkg", "__init__.py")).read() == "VALUE = 2\n"


def _count_questions(pusher) -> dict:
    """{message type: how many hosts} of what ``pusher`` asks every host from now on."""
    asked: dict = {}
    answers = pusher._answers

    def counted(make, targets):
        msg = make(targets[0])
        name = type(msg).__name__ + ("+chunks" if getattr(msg, "inline", None) is not None else "")
        asked[name] = asked.get(name, 0) + len(targets)
        return answers(make, targets)

    pusher._answers = counted
    return asked


def test_a_chunk_corrupted_in_transit_is_detected_and_sent_again(client, agents, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("A = 1\n" * 1000)
    (ws / "b.bin").write_bytes(os.urandom(1 << 20))
    seen = []

    def corrupt_first_batch(batch: int, payload: bytes) -> bytes:
        seen.append(batch)
        if batch != 0:
            return payload
        b = bytearray(payload)
        b[len(b) // 2] ^= 0xFF
        return bytes(b)

    p = WorkspacePusher(client, str(ws), targets(agents))
    p._tamper = corrupt_first_batch
    r = p.sync()
    assert len(seen) > 1, "the corrupted chunk was sent again"
    for m in r.mounts:
        assert open(os.path.join(m["mountpoint"], "b.bin"), "rb").read() == (ws / "b.bin").read_bytes()
        assert open(os.path.join(m["mountpoint"], "a.py")).read() == "A = 1\n" * 1000


def test_an_agent_killed_during_a_transfer_fails_the_sync_and_the_next_one_completes(client, tmp_path, fuse):
    started = start_agents(client, tmp_path, 2)
    ws = tmp_path / "ws"
    ws.mkdir()
    make_tree(ws)
    (ws / "more.bin").write_bytes(os.urandom(20 << 20))
    try:
        p = WorkspacePusher(client, str(ws), targets(started))
        p.sync()
        mnt1 = workspace_of(client, started[1])["mounts"][0]["mountpoint"]
        (ws / "more.bin").write_bytes(os.urandom(20 << 20))

        def kill_second_host(batch: int, payload: bytes) -> bytes:
            if batch == 1:
                os.kill(started[1].pid, signal.SIGKILL)
            return payload

        p._tamper = kill_second_host
        with pytest.raises(WorkspaceError) as e:
            p.sync()
        assert "host h1 (rank 1) died during the sync" in e.value.message
        assert wait_gone([started[1].pid]) == []
        started[1].proc.wait()
        # Its mount process followed it (it dies with its parent and unmounts).
        deadline = time.monotonic() + T
        while is_mounted(mnt1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_mounted(mnt1)
        # The host comes back (a new agent over the same host folder): the next sync completes.
        started[1] = start_agent(client, tmp_path, 1)
        p2 = WorkspacePusher(client, str(ws), targets(started))
        r = p2.sync()
        for m in r.mounts:
            assert open(os.path.join(m["mountpoint"], "more.bin"), "rb").read() == (ws / "more.bin").read_bytes()
    finally:
        for a in started:
            a.stop()
    assert wait_gone([a.pid for a in started]) == []


def _fill(path) -> None:
    """Write ``path`` until its disk is full (ENOSPC ends it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_host_with_a_full_disk_fails_the_sync_clearly_and_keeps_serving(client, tmp_path, fuse, tiny_disk):
    started = start_agents(client, tmp_path, 1, env={"MONARCH_WORKSPACE_DIR": str(tiny_disk / "ws")})
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("v1\n")
    try:
        p = WorkspacePusher(client, str(ws), targets(started))
        mnt = p.sync().mounts[0]["mountpoint"]
        (ws / "a.py").write_text("v2\n")
        (ws / "data.bin").write_bytes(os.urandom(3 << 20))
        with pytest.raises(WorkspaceError) as e:
            p.sync()
        assert "host h0 (rank 0): no space left on the host's disk" in e.value.message
        assert open(os.path.join(mnt, "a.py")).read() == "v1\n", "the previous generation is still served"
    finally:
        for a in started:
            a.stop()
    assert wait_gone([a.pid for a in started]) == []
    assert not is_mounted(mnt)


def _h1_on_a_tiny_disk(client, tmp_path, tiny_disk) -> tuple[list, Path]:
    """Two agents, h1's workspace on ``tiny_disk``, and a workspace folder of one file (a.py, "v1")."""
    started = [start_agent(client, tmp_path, 0), start_agent(client, tmp_path, 1, {"MONARCH_WORKSPACE_DIR": str(tiny_disk / "ws")})]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("v1\n")
    return started, ws


def test_an_edit_one_host_cannot_store_switches_no_host(client, tmp_path, fuse, tiny_disk):
    """An edit is one round (its chunks inside the switch): the hosts that switched are switched back."""
    started, ws = _h1_on_a_tiny_disk(client, tmp_path, tiny_disk)
    filler = tiny_disk / "filler"
    try:
        p = WorkspacePusher(client, str(ws), targets(started))
        mnts = [m["mountpoint"] for m in p.sync().mounts]
        # Nothing left on h1's disk.
        _fill(filler)
        (ws / "a.py").write_text("v2\n")
        with pytest.raises(WorkspaceError) as e:
            p.sync()
        assert "host h1 (rank 1): no space left on the host's disk" in e.value.message
        assert [open(os.path.join(m, "a.py")).read() for m in mnts] == ["v1\n", "v1\n"], "h0 was switched back"
        filler.unlink()
        r = p.sync()
        assert r.changed and [open(os.path.join(m, "a.py")).read() for m in mnts] == ["v2\n", "v2\n"]
    finally:
        for a in started:
            a.stop()
    assert wait_gone([a.pid for a in started]) == []


def test_stopping_the_agent_leaves_no_mount_and_no_store(client, tmp_path, fuse):
    started = start_agents(client, tmp_path, 1)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("a\n")
    p = WorkspacePusher(client, str(ws), targets(started))
    r = p.sync()
    root = workspace_of(client, started[0])["root"]
    started[0].stop()
    assert wait_gone([started[0].pid]) == []
    assert not is_mounted(r.mounts[0]["mountpoint"]) and not os.path.exists(root)


def test_remotemount_open_refresh_close_with_subdir(client, agents, tmp_path):
    from monarch.actor import HostMesh
    from monarch.actor._client import HostRef
    from monarch.actor import ActorError
    from monarch.remotemount import remotemount

    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "model.py").write_text("LAYERS = 1\n")
    mesh = HostMesh([HostRef(a.addr, a.info["host"], i) for i, a in enumerate(agents)])
    with pytest.raises(ValueError, match="would hide the source folder"):
        remotemount(mesh, str(ws)).open()
    handle = remotemount(mesh, str(ws), str(tmp_path / "mnt" / "$SUBDIR"))
    with pytest.raises(ActorError, match="call open"):  # raised in the mount's owner actor, as in Monarch
        handle.refresh()
    handle.open()
    places = [tmp_path / "mnt" / f"hosts_{i}" for i in range(4)]
    try:
        for p in places:
            assert (p / "model.py").read_text() == "LAYERS = 1\n" and is_mounted(str(p))
        (ws / "model.py").write_text("LAYERS = 2\n")
        handle.refresh()
        for p in places:
            assert (p / "model.py").read_text() == "LAYERS = 2\n"
    finally:
        handle.close()
        handle.close()
    assert not any(is_mounted(str(p)) for p in places)


def test_gather_mount_shows_every_hosts_folder_read_only(client, agents, tmp_path):
    from monarch.actor import HostMesh
    from monarch.actor._client import HostRef
    from monarch.gather_mount import gather_mount

    for i in range(4):
        d = tmp_path / "hostdata" / f"hosts_{i}"
        (d / "sub").mkdir(parents=True)
        (d / "train.log").write_text(f"host {i} step 1\n")
        (d / "sub" / "x.bin").write_bytes(bytes([i]) * 300_000)
    mesh = HostMesh([HostRef(a.addr, a.info["host"], i) for i, a in enumerate(agents)])
    local = tmp_path / "gathered"
    with gather_mount(mesh, str(tmp_path / "hostdata" / "$SUBDIR"), str(local)) as m:
        assert is_mounted(str(local))
        assert sorted(os.listdir(local)) == [f"hosts_{i}" for i in range(4)]
        for i in range(4):
            assert (local / f"hosts_{i}" / "train.log").read_text() == f"host {i} step 1\n"
            assert (local / f"hosts_{i}" / "sub" / "x.bin").read_bytes() == bytes([i]) * 300_000
        with pytest.raises(OSError) as e:
            open(local / "hosts_0" / "train.log", "w")
        assert e.value.errno == 30  # EROFS
        assert not (local / "hosts_9").exists() and not (local / "hosts_0" / "nope").exists()
        (tmp_path / "hostdata" / "hosts_2" / "train.log").write_text("host 2 step 2\n")
        assert (local / "hosts_2" / "train.log").read_text() == "host 2 step 2\n", "bytes are read fresh"
    m.close()
    assert not is_mounted(str(local))


def test_a_file_changing_during_a_sync_is_never_served_torn(client, agents, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(b"a" * (9 << 20))
    p = WorkspacePusher(client, str(ws), targets(agents))
    read = p.packer.read_chunk
    calls = []

    def racing(cid, src):
        if not calls:  # packed as all 'a'; rewritten as all 'b' before its chunks are read to be sent
            (ws / "big.bin").write_bytes(b"b" * (9 << 20))
        calls.append(cid)
        return read(cid, src)

    p.packer.read_chunk = racing
    r = p.sync()
    for m in r.mounts:
        assert open(os.path.join(m["mountpoint"], "big.bin"), "rb").read() == b"b" * (9 << 20)


def test_a_sync_asks_and_switches_the_hosts_through_the_tree_of_agents(client, agents, tmp_path, monkeypatch):
    """WsMissing and WsCommit go to the first host of each subtree, which forwards (and answers for) the rest."""
    from monarch_agents import fanout

    monkeypatch.setattr(fanout, "DIRECT_MAX", 1)
    monkeypatch.setattr(fanout, "DEGREE", 2)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("A = 1\n")
    p = WorkspacePusher(client, str(ws), targets(agents))
    before = [workspace_of_fanout(client, a) for a in agents]
    r = p.sync()
    assert [m["files"] for m in r.mounts] == [1] * 4
    forwarded = [workspace_of_fanout(client, a) - b for a, b in zip(agents, before)]
    # Two subtrees of two: each first host forwarded the second's question and switch.
    assert forwarded == [2, 0, 2, 0], forwarded
    for m in r.mounts:
        assert open(os.path.join(m["mountpoint"], "a.py")).read() == "A = 1\n"
    # An edit: its chunks inside each host's switch, one message through the tree.
    (ws / "a.py").write_text("A = 2\n")
    r = p.sync()
    assert r.sent_chunks == 2
    forwarded = [workspace_of_fanout(client, a) - b for a, b in zip(agents, before)]
    assert forwarded == [3, 0, 3, 0], forwarded
    for m in r.mounts:
        assert open(os.path.join(m["mountpoint"], "a.py")).read() == "A = 2\n"


def workspace_of_fanout(client, agent) -> int:
    return client.request(agent.addr, lambda port: Ping(port)).get(timeout=T).services["fanout"]["forwarded"]


def test_an_edit_corrupted_in_transit_is_sent_again(client, agents, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("A = 1\n")
    p = WorkspacePusher(client, str(ws), targets(agents))
    p.sync()
    sent = []

    def corrupt_first(batch: int, payload: bytes) -> bytes:
        sent.append(batch)
        return payload if len(sent) > 1 else payload[:-1] + bytes([payload[-1] ^ 0xFF])

    p._tamper = corrupt_first
    (ws / "a.py").write_text("A = 2\n")
    r = p.sync()
    assert len(sent) == 2 and r.sent_chunks == 2
    for m in r.mounts:
        assert open(os.path.join(m["mountpoint"], "a.py")).read() == "A = 2\n"


def test_a_host_that_cannot_be_switched_back_is_named_in_the_error(client, tmp_path, fuse, tiny_disk):
    """The edit fails on h1 (full disk) and h0, switched already, cannot go back (the previous tree's
    tree left its store): the one error line says h0 serves the new tree, not only why h1 failed."""
    started, ws = _h1_on_a_tiny_disk(client, tmp_path, tiny_disk)
    filler = tiny_disk / "filler"
    try:
        p = WorkspacePusher(client, str(ws), targets(started))
        mnts = [m["mountpoint"] for m in p.sync().mounts]
        packs = tmp_path / "h0" / "ws" / "store" / "packs"
        assert os.listdir(packs), "h0 keeps the previous tree (its manifest too) in packs"
        for f in os.listdir(packs):
            os.unlink(packs / f)
        _fill(filler)
        (ws / "a.py").write_text("v2\n")
        with pytest.raises(WorkspaceError) as e:
            p.sync()
        msg = e.value.message
        assert "\n" not in msg
        assert msg.startswith("host h1 (rank 1): no space left on the host's disk"), msg
        assert "host h0 (rank 0) could not be switched back and serves the new tree: " in msg, msg
        assert [open(os.path.join(m, "a.py")).read() for m in mnts] == ["v2\n", "v1\n"], "as the error says"
    finally:
        for a in started:
            a.stop()
    assert wait_gone([a.pid for a in started]) == []


def test_a_failed_two_round_switch_switches_the_other_hosts_back(client, tmp_path, fuse):
    """The two rounds' switch fails on h1 (its mount folder cannot be made) after h0 switched: h0 is
    switched back to the previous tree, as the one-round edit does; on a first sync, with no tree to
    go back to, the error's one line says h0 serves the new one."""
    started = [start_agent(client, tmp_path, 0), start_agent(client, tmp_path, 1)]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("v1\n")
    (tmp_path / "a-file").write_text("")
    good = targets(started)
    bad = [good[0], Target(good[1].addr, good[1].host, 1, str(tmp_path / "a-file" / "mnt"))]
    try:
        p = WorkspacePusher(client, str(ws), bad)
        with pytest.raises(WorkspaceError) as e:
            p.sync()
        msg = e.value.message
        assert "\n" not in msg and msg.startswith("h1: could not switch the workspace"), msg
        assert msg.endswith("; host h0 (rank 0) switched and serves the new tree (no previous tree to go back to)"), msg
        p.targets = good
        mnts = [m["mountpoint"] for m in p.sync().mounts]
        assert [open(os.path.join(m, "a.py")).read() for m in mnts] == ["v1\n", "v1\n"]
        # Bigger than an edit's one round: chunks first, then the switch every host is asked for.
        (ws / "a.py").write_text("v2\n" + "#" * (64 << 10))
        p.targets = bad
        with pytest.raises(WorkspaceError) as e:
            p.sync()
        msg = e.value.message
        assert "\n" not in msg and msg.startswith("h1: could not switch the workspace") and ";" not in msg, msg
        assert open(os.path.join(mnts[0], "a.py")).read() == "v1\n", "h0 was switched back"
    finally:
        for a in started:
            a.stop()
    assert wait_gone([a.pid for a in started]) == []
