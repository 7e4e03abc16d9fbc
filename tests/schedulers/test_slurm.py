"""End to end against a real Slurm cluster (the ``slurm_cluster`` fixture in conftest.py: 4 nodes
on this machine), through the job API.  Each test works in its own directory and releases its
job in a ``finally``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from monarch.errors import SchedulerError, StateError
from monarch._workbench.reserve import describe, load_live, release, reserve
from monarch._workbench.state import JobSpec, StatePaths
from monarch_schedulers import HostState
from monarch_schedulers.agent_launch import project_root
from monarch_agents.transport import addr_host, is_same_host
from tests.schedulers.conftest import NO_NETNS, assert_released, cluster_plan, leftovers, poll

OPTS = {"partition": "debug", "time": "10:00"}

pytestmark = pytest.mark.timeout(120)


# The actor part runs in a fresh interpreter: a process talks to one job (one set of keys), and
# this pytest process may hold another; defined in __main__, the actor class travels by value.
_ACTOR_SCRIPT = textwrap.dedent("""
    import json, os, socket
    from monarch.actor import Actor, endpoint
    from monarch._workbench.reserve import load_live
    from monarch.job.job import host_mesh_of
    from monarch_agents import runtime

    class WhereAmI(Actor):
        @endpoint
        def where(self) -> list:
            # Slurm's node name, the kernel's hostname, and the address the proc listens on.
            return [os.environ["MONARCH_HOSTNAME"], socket.gethostname(), runtime.current().mailbox.bind_host]

    record, _ = load_live()
    procs = host_mesh_of(record).spawn_procs(per_host={"gpus": 1})
    where = procs.spawn("where", WhereAmI).where.call().get(timeout=60).values()
    rt = runtime.current()
    # How this client reached the nodes' agents and procs (ipc.Link: the same-host fast path;
    # _Peer: ZeroMQ over TCP with CURVE), and where it listens for their answers.
    links = sorted({type(p).__name__ for p in rt.mailbox._peers.values()})
    print(json.dumps({"where": where, "links": links, "client": rt.mailbox.bind_host}))
""")


def test_reserve_four_nodes_spawn_and_release(workdir):
    plan = cluster_plan()
    t0 = time.monotonic()
    r = reserve(JobSpec("slurm", 4, 1, dict(OPTS)), name="default", timeout=60)
    rec = r.record
    try:
        assert not r.reused and rec.ready
        assert sorted(h.host for h in rec.hosts) == ["n1", "n2", "n3", "n4"]
        assert sorted(h.host_rank for h in rec.hosts) == [0, 1, 2, 3]
        d = describe(rec)
        assert d.state is HostState.RUNNING and d.native_state == "RUNNING"
        assert d.nodes == ["n1", "n2", "n3", "n4"] and 0 < d.time_left_s <= 600
        # The leftover check below can see the agents (so its "none left" means something).
        agents = [p for p in leftovers(rec.job_id, rec.job_dir) if "monarch_agents.host_agent" in p]
        assert len(agents) == 4, agents
        print(f"reserve: {time.monotonic() - t0:.2f} s")

        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", _ACTOR_SCRIPT], capture_output=True, text=True, timeout=90,
                             env={**os.environ, "PYTHONPATH": project_root()})
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert sorted(w[0] for w in got["where"]) == ["n1", "n2", "n3", "n4"]
        print(f"spawn + call: {time.monotonic() - t0:.2f} s")
        if plan is not None:
            # Each node is a host of its own: its own hostname and address, none of them the
            # client's, and every link from the client to a node is TCP, never the same-host path.
            ips = {f"n{i + 1}": h.ip for i, h in enumerate(plan.hosts)}
            assert sorted(map(tuple, got["where"])) == [(n, n, ips[n]) for n in ("n1", "n2", "n3", "n4")]
            assert {h.host: h.ip for h in rec.hosts} == ips
            assert {h.host: addr_host(h.addr) for h in rec.hosts} == ips
            assert got["client"] == plan.bridge_ip and got["client"] not in ips.values()
            assert got["links"] == ["_Peer"], got["links"]
            assert not any(is_same_host(h.addr) for h in rec.hosts)

        logs = _scheduler_logs(rec)
        assert f"== slurm-{rec.job_id}.out ==" in logs and "== host3 ==" in logs and '"host": "n4"' in logs
    finally:
        t0 = time.monotonic()
        release(rec, r.path)
        print(f"release: {time.monotonic() - t0:.2f} s")
    assert_released(rec.job_id, rec.job_dir)
    assert not os.path.exists(r.path)
    # Releasing again is harmless.
    release(rec, r.path)
    if plan is None:
        pytest.skip(f"Slurm part passed; the nodes share this machine's network stack: {NO_NETNS}")


def test_default_client_host_is_this_machines_route_to_the_nodes(slurm_cluster):
    # This machine's name resolves to loopback here (as in many containers), which no node could
    # reach: the default is the address that routes to the nodes sinfo names (the bridge's).
    from monarch_schedulers.slurm import default_client_host

    plan = cluster_plan()
    assert default_client_host() == (plan.bridge_ip if plan else "127.0.0.1")


def _scheduler_logs(rec) -> str:
    from monarch._workbench.reserve import scheduler_for

    return scheduler_for(rec).logs(rec.job_id, job_dir=rec.job_dir)


def test_no_wait_then_load_live_waits(workdir):
    t0 = time.monotonic()
    r = reserve(JobSpec("slurm", 2, 1, dict(OPTS)), name="default", wait=False)
    submitted = time.monotonic() - t0
    try:
        assert not r.record.ready and r.record.hosts == []
        assert submitted < 5, f"wait=False took {submitted:.1f} s"
        rec, path = load_live()
        assert path == r.path and rec.ready
        assert sorted(h.host for h in rec.hosts) == ["n1", "n2"]
        # The state file now has the hosts: a second load does not wait.
        again, _ = load_live(wait=False)
        assert again.ready and again.job_id == rec.job_id
        # And the same shape reuses the live reservation.
        r2 = reserve(JobSpec("slurm", 2, 1, dict(OPTS)), name="default")
        assert r2.reused and r2.record.job_id == rec.job_id
    finally:
        release(r.record, r.path)
    assert_released(r.record.job_id, r.record.job_dir)


def test_external_scancel_is_detected(workdir):
    r = reserve(JobSpec("slurm", 2, 1, dict(OPTS)), name="default", timeout=60)
    rec = r.record
    try:
        subprocess.run(["scancel", rec.job_id], check=True, capture_output=True)
        # COMPLETING (already not alive) comes first, for as long as the nodes take to clean up.
        d = poll(lambda: (lambda d: d if d.native_state not in ("RUNNING", "COMPLETING") else None)(describe(rec)),
                 15, "the job's final state")
        assert d.state is HostState.FAILED and d.native_state == "CANCELLED"
        assert d.reason == "cancelled (scancel or admin)"
        with pytest.raises(StateError) as e:
            load_live()
        assert "is gone: cancelled (scancel or admin)" in e.value.message
        assert "monarch serve" in e.value.hint
    finally:
        release(rec, r.path)
    assert_released(rec.job_id, rec.job_dir)


def test_time_limit_shows_as_time_left(workdir):
    # Slurm's smallest limit is a minute; "1" is one minute.
    r = reserve(JobSpec("slurm", 1, 1, {"partition": "debug", "time": "1"}), name="short", timeout=60)
    rec = r.record
    try:
        d = describe(rec)
        assert d.state is HostState.RUNNING
        assert d.time_left_s is not None and 0 < d.time_left_s <= 60
        assert "#SBATCH --time=1\n" in open(os.path.join(rec.job_dir, "slurm.sbatch")).read()
    finally:
        release(rec, r.path)
    assert_released(rec.job_id, rec.job_dir)


def test_sbatch_refusal_is_quick_and_readable(workdir):
    t0 = time.monotonic()
    with pytest.raises(SchedulerError) as e:
        reserve(JobSpec("slurm", 2, 1, {"partition": "no-such-partition"}), name="default")
    assert time.monotonic() - t0 < 10
    msg = e.value.message
    assert msg.startswith("sbatch refused the job: ") and "\n" not in msg
    assert "no-such-partition" in msg or "partition" in msg.lower()
    assert "sinfo" in e.value.hint
    # Nothing half-made is left behind: no state, no job folder with keys in it.
    assert not os.path.exists(StatePaths().state_file("default"))
    assert not os.path.exists(StatePaths().job_dir("default"))
