"""Control messages through a tree of real host agents (``monarch_agents.fanout``).

A local reservation of 12 hosts with a fan-out degree of 2 (so the tree is 3 levels deep below
the client), driven through the real ``monarch`` command: answers match the direct path, a rank's
failure stops every rank, and an inner agent killed with -9 in the middle of a command is one
host's error, never a hang nor the loss of the hosts below it.
"""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from monarch_agents import messages as m
from monarch_agents.fanout import fan_out, split
from tests.cli.conftest import monarch
from tests.helpers import wait_gone

pytestmark = pytest.mark.timeout(300)

HOSTS = 12
#: Degree 2, every size through the tree; a child silent for 3 s is lost (the agents get it at serve).
TREE = {"MONARCH_FANOUT_DEGREE": "2", "MONARCH_FANOUT_DIRECT_MAX": "0", "MONARCH_FANOUT_PING_S": "0.5",
        "MONARCH_FANOUT_SILENT_S": "3"}
DIRECT = {"MONARCH_FANOUT_DEGREE": "0"}


def test_split_cuts_contiguous_subtrees():
    assert split(list(range(7)), 2) == [[0, 1, 2, 3], [4, 5, 6]]
    assert split(list(range(3)), 8) == [[0], [1], [2]]
    assert split([], 4) == []
    assert sum(split(list(range(100)), 8), []) == list(range(100))


@pytest.fixture
def reservation(tmp_path):
    """12 local hosts, served as a user would; stopped (and every agent gone) at the end."""
    r = monarch("serve", "--hosts", str(HOSTS), "--json", cwd=tmp_path, timeout=180, env=TREE)
    assert r.returncode == 0, r.stderr
    pids = [h["pid"] for h in json.loads(monarch("status", "--json", cwd=tmp_path, env=TREE).stdout)["hosts"]]
    assert len(pids) == HOSTS
    yield tmp_path, pids
    monarch("stop", "--force", cwd=tmp_path, timeout=120)
    assert wait_gone(pids) == []


def _record(workdir):
    from monarch._workbench.state import load_state

    return load_state(os.path.join(workdir, ".monarch", "job_state.pkl"))


def _status(workdir, env):
    r = monarch("status", "--json", cwd=workdir, env=env)
    return r, json.loads(r.stdout)


def test_status_and_query_through_the_tree_match_the_direct_path(reservation):
    workdir, pids = reservation
    assert monarch("run", "--", "true", cwd=workdir, env=TREE).returncode == 0
    r_tree, tree = _status(workdir, TREE)
    r_direct, direct = _status(workdir, DIRECT)
    assert r_tree.returncode == r_direct.returncode == 0
    key = [(h["host"], h["pid"], h.get("agent")) for h in tree["hosts"]]
    assert key == [(h["host"], h["pid"], h.get("agent")) for h in direct["hosts"]]
    sql = "SELECT host, count(*) AS n, max(exit_code) AS hi FROM run_ranks GROUP BY host ORDER BY host"
    q_tree = monarch("query", "--json", sql, cwd=workdir, env=TREE)
    q_direct = monarch("query", "--json", sql, cwd=workdir, env=DIRECT)
    assert q_tree.returncode == 0, q_tree.stderr
    assert json.loads(q_tree.stdout) == json.loads(q_direct.stdout)
    assert len(json.loads(q_tree.stdout)["rows"]) == HOSTS


def test_sync_asks_and_commits_through_the_tree(reservation):
    workdir, _ = reservation
    ws = workdir / "ws"
    ws.mkdir()
    (ws / "v.py").write_text("V = 1\n")
    for edit in ("V = 1", "V = 2"):
        (ws / "v.py").write_text(edit + "\n")
        r = monarch("sync", "--workspace", str(ws), cwd=workdir, env=TREE)
        assert r.returncode == 0, r.stderr
        r = monarch("run", "-w", str(ws), "--", "cat", "v.py", cwd=workdir, env=TREE)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.splitlines()) == sorted(f"[host{i}] {edit}" for i in range(HOSTS))


def test_the_tree_is_a_tree(reservation):
    """Inner agents forward; the client sends to `degree` roots only."""
    workdir, _ = reservation
    from monarch._workbench.hosts import NO_PORT

    record = _record(workdir)
    rt = record.runtime()
    hosts = sorted(record.hosts, key=lambda h: h.host_rank)
    call = fan_out(rt, [(h.addr, h.host, m.Ping(NO_PORT)) for h in hosts], timeout_s=30, degree=2, direct=False)
    assert call.wait(60)
    infos = [call.results[i] for i in range(HOSTS)]
    assert all(ok for ok, _ in infos), infos
    assert [v.host for _, v in infos] == [h.host for h in hosts]
    forwarded = {v.host: v.services["fanout"]["forwarded"] for _, v in infos}
    # 12 hosts, degree 2: the client sends to host0 and host6, each forwards its 5 others; ...
    assert forwarded["host0"] >= 5 and forwarded["host6"] >= 5 and forwarded["host11"] == 0


def test_an_inner_agent_killed_mid_ping_is_one_hosts_error(reservation):
    workdir, pids = reservation
    os.kill(pids[1], signal.SIGKILL)  # host1 forwards for host2 and host3 (degree 2, 12 hosts)
    assert wait_gone([pids[1]]) == []
    t0 = time.monotonic()
    r, doc = _status(workdir, TREE)
    assert time.monotonic() - t0 < 60
    by_host = {h["host"]: h for h in doc["hosts"]}
    assert "host1" in r.stderr or by_host["host1"].get("agent") != "up"
    assert [h for h, v in by_host.items() if v.get("agent") == "up"] == [f"host{i}" for i in range(HOSTS) if i != 1]


def test_an_inner_agent_killed_mid_run_loses_only_its_rank(reservation):
    """exec (each rank stands alone): host2 and host3, whose ends went up through host1, still report."""
    workdir, pids = reservation
    import subprocess

    from tests.cli.conftest import MONARCH, ROOT

    go = workdir / "go"  # the ranks end once host1 is gone (a fixed sleep could end them before, under load)
    wait = f"until [ -e {go} ]; do sleep 0.05; done"
    p = subprocess.Popen([*MONARCH, "exec", "--all", "--", "sh", "-c", f"echo go; {wait}; echo done $NODE_RANK"],
                         cwd=workdir, env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", **TREE},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_ranks(pids, wait)
    os.kill(pids[1], signal.SIGKILL)
    assert wait_gone([pids[1]]) == []
    go.touch()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 5, err  # a host agent lost
    done = sorted(line for line in out.splitlines() if " done " in line)
    assert done == sorted(f"[host{i}] done {i}" for i in range(HOSTS) if i != 1), out


def test_an_inner_agent_killed_mid_run_ends_the_run_in_one_line_naming_it(reservation):
    """`monarch run` (the first failure stops the others): host1, which forwarded the run to host2
    and host3, is killed -9; the run ends with status 5 and one error line naming host1, and no
    rank is left anywhere (host1's own rank included: its zygote kills it)."""
    workdir, pids = reservation
    import subprocess

    from tests.cli.conftest import MONARCH, ROOT

    marker = "sleep 317"  # what only this test's ranks run
    p = subprocess.Popen([*MONARCH, "run", "--", "sh", "-c", f"echo go; exec {marker}"],
                         cwd=workdir, env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", **TREE},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_ranks(pids, marker)
        deadline = time.monotonic() + 60
        while len(everywhere := _anywhere(marker.split())) < HOSTS:  # each sh has exec'd it
            assert time.monotonic() < deadline, everywhere
            time.sleep(0.1)
        assert len(everywhere) == HOSTS
        os.kill(pids[1], signal.SIGKILL)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 5, err  # a host agent lost
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "host1" in errors[0], err
    assert not any(f"host{i}" in errors[0] for i in range(2, HOSTS)), err
    assert sorted(line for line in out.splitlines() if line.endswith(" go")) == sorted(
        f"[host{i}] go" for i in range(HOSTS)), out
    assert wait_gone(everywhere) == []


def test_an_inner_agent_stopped_mid_run_is_lost_not_waited_for(reservation):
    """SIGSTOP closes no connection: its parent's pings find it silent, and the hosts below it report.

    Each rank waits for a file the test makes once every rank runs and host1 is stopped: with a
    fixed sleep, a loaded machine let the first ranks end before the last had started (never all
    seen at once), or before host1 was stopped (their ends went up before it was silent)."""
    workdir, pids = reservation
    import subprocess

    from tests.cli.conftest import MONARCH, ROOT

    go = workdir / "go"
    wait = f"until [ -e {go} ]; do sleep 0.05; done"
    p = subprocess.Popen([*MONARCH, "exec", "--all", "--", "sh", "-c", f"{wait}; echo done $NODE_RANK"],
                         cwd=workdir, env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", **TREE},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_ranks(pids, wait)
    os.kill(pids[1], signal.SIGSTOP)
    go.touch()
    try:
        out, err = p.communicate(timeout=120)
    finally:
        os.kill(pids[1], signal.SIGCONT)
    assert p.returncode == 5, err
    done = sorted(line for line in out.splitlines() if " done " in line)
    assert done == sorted(f"[host{i}] done {i}" for i in range(HOSTS) if i != 1), out


def test_a_killed_client_leaves_no_rank_behind_anywhere_in_the_tree(reservation):
    """Only the first hosts watch the client; the rest hear it is gone from them (OwnerGone)."""
    workdir, pids = reservation
    import subprocess

    from tests.cli.conftest import MONARCH, ROOT

    p = subprocess.Popen([*MONARCH, "run", "--", "sleep", "300"], cwd=workdir,
                         env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", **TREE},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_ranks(pids, "sleep 300")
    p.kill()
    p.wait()
    deadline = time.monotonic() + 60
    while _ranks(pids, "sleep 300") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ranks(pids, "sleep 300") == []


def test_a_subtree_asked_twice_starts_each_rank_once_and_every_asker_hears_its_end(reservation):
    """A client that takes its first hosts for too slow (an acknowledgement wait of 1 ms) asks their
    subtrees straight too: each rank still runs once, and the run ends."""
    workdir, _ = reservation
    ran = workdir / "ran"
    r = monarch("run", "--", "sh", "-c", f'echo "$NODE_RANK" >> {ran}', cwd=workdir,
                env={**TREE, "MONARCH_FANOUT_ACK_S": "0.001"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(int(x) for x in ran.read_text().split()) == list(range(HOSTS))


def test_a_failed_rank_stops_every_rank_through_the_tree(reservation):
    workdir, pids = reservation
    last = HOSTS - 1
    r = monarch("run", "--", "sh", "-c", f'[ "$NODE_RANK" = "{last}" ] && exit 3; exec sleep 300',
                cwd=workdir, env=TREE, timeout=120)
    assert r.returncode == 3, r.stderr
    assert f"rank {last} on host{last} exited with code 3" in r.stderr
    assert _ranks(pids, "sleep 300") == []


def test_shutdown_through_the_tree_is_answered_by_every_agent_then_stops_it(reservation):
    """An inner agent stops only once what it forwarded has answered through it."""
    workdir, pids = reservation
    record = _record(workdir)
    hosts = sorted(record.hosts, key=lambda h: h.host_rank)
    call = fan_out(record.runtime(), [(h.addr, h.host, m.Shutdown(None)) for h in hosts], timeout_s=60, degree=2,
                   direct=False)
    assert call.wait(90)
    assert [call.results[i] for i in range(HOSTS)] == [(True, True)] * HOSTS
    assert wait_gone(pids) == []


def test_stop_through_the_tree(reservation):
    workdir, pids = reservation
    r = monarch("stop", cwd=workdir, env=TREE, timeout=120)
    assert r.returncode == 0, r.stderr
    assert wait_gone(pids) == []


def test_an_agent_without_fan_outs_is_asked_straight(client, tmp_path):
    """An agent of an older version drops a Fanout unanswered: after a short wait its subtree is
    asked straight, by the client or by the agent that forwarded to it."""
    from tests.helpers import start_host_agent

    agents = [start_host_agent(client.keys, tmp_path, hostname="new0"),
              start_host_agent(client.keys, tmp_path, hostname="old1", module="tests.agents.no_fanout_agent"),
              start_host_agent(client.keys, tmp_path, hostname="new2")]
    try:
        for order in ([0, 1, 2], [1, 0, 2]):  # the old one forwarded to by an agent, then by the client
            targets = [(agents[i].addr, agents[i].info["host"], m.Ping(m.PortRef("", 0))) for i in order]
            call = fan_out(client, targets, timeout_s=20, degree=1, direct=False)  # a chain
            assert call.wait(40)
            got = [call.results[i] for i in range(3)]
            assert all(ok for ok, _ in got), got
            assert [v.host for _, v in got] == [agents[i].info["host"] for i in order]
    finally:
        for a in agents:
            a.stop()
    assert wait_gone([a.pid for a in agents]) == []


def test_pods_agents_cannot_forward_so_their_parent_asks_their_subtree(client, tmp_path):
    """A pod's host agent holds no client key (its forwards would be refused): it answers its own
    message and hands the rest of its subtree back, which the client then asks straight."""
    from tests.helpers import start_host_agent

    agents = [start_host_agent(client.keys.for_hosts(), tmp_path, hostname=f"pod{i}") for i in range(3)]
    try:
        # A telemetry scan is the client's alone: a pod's forward of it would be refused.
        scan = m.TelemetryScan({"hosts": 'SELECT host FROM "hosts"'}, 10.0, m.PortRef("", 0))
        call = fan_out(client, [(a.addr, a.info["host"], scan) for a in agents], timeout_s=20, degree=1, direct=False)
        assert call.wait(40)
        got = [call.results[i] for i in range(3)]
        assert all(ok and isinstance(v, dict) and "hosts" in v for ok, v in got), got
    finally:
        for a in agents:
            a.stop()
    assert wait_gone([a.pid for a in agents]) == []


def _ranks(pids: list[int], cmd: str) -> list[int]:
    found = []
    for pid in pids:
        try:
            for c in psutil.Process(pid).children(recursive=True):
                if cmd in " ".join(c.cmdline()):
                    found.append(c.pid)
        except psutil.Error:
            continue
    return found


def _anywhere(argv: list[str]) -> list[int]:
    """Every process on the machine running ``argv``, whoever its parent is now (an orphan too)."""
    return [proc.pid for proc in psutil.process_iter(["cmdline"]) if proc.info["cmdline"] == argv]


def _wait_for_ranks(pids: list[int], cmd: str) -> None:
    deadline = time.monotonic() + 60
    while len(_ranks(pids, cmd)) < len(pids):
        assert time.monotonic() < deadline, "the ranks did not all start"
        time.sleep(0.1)
