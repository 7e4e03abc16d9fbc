"""The whole product between hosts with their own network stacks: `monarch serve --netns`.

Each host agent runs in its own network namespace with its own address on a
bridge, so every message between the client and a host, or between hosts,
takes the inter-host path (TCP, CURVE, ZeroMQ heartbeats), as on a cluster.
Needs root and `ip`/`nsenter` (CI has both); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from monarch_schedulers import netns
from tests.cli.conftest import MONARCH, ROOT, monarch
from tests.helpers import session_pids, wait_gone

pytestmark = [pytest.mark.skipif(bool(netns.unavailable()), reason=netns.unavailable() or "-"),
              pytest.mark.timeout(240)]

ENV = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}


def _serve(workdir, hosts=2):
    r = monarch("--json", "serve", "--hosts", str(hosts), "--netns", cwd=workdir, check=True, timeout=120)
    return json.loads(r.stdout)


def _plan(workdir) -> netns.NetnsPlan:
    with open(workdir / ".monarch" / "jobs" / "default" / "local.json") as f:
        return netns.NetnsPlan.from_json(json.load(f)["netns"])


def _start_run(workdir, *cmd):
    """`monarch run -- CMD` in the background, returned once both hosts printed their first line."""
    p = subprocess.Popen([*MONARCH, "run", "--", *cmd], cwd=workdir, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV)
    assert p.stdout.readline().startswith("[host")
    assert p.stdout.readline().startswith("[host")
    return p


def _rank_procs(marker):
    return [pid for pid, cmd in session_pids().items() if cmd.split(" ", 1)[0] in ("sh", "sleep") and marker in cmd]


@pytest.fixture
def netns_workdir(workdir):
    """A working directory whose --netns reservation is stopped, and its namespaces checked gone."""
    yield workdir
    plans = []
    try:
        plans.append(_plan(workdir))
    except (OSError, KeyError, ValueError):
        pass
    monarch("stop", "--force", cwd=workdir, timeout=60)
    for p in plans:
        assert not netns.exists(p), f"namespaces of {p.tag} left behind"
        netns.remove(p)  # in case


ACTORS = """
import os, socket
from monarch.actor import Actor, endpoint
from monarch.job import job_load
from monarch_agents import runtime

class Where(Actor):
    @endpoint
    def where(self):
        # The address this proc's host uses towards the client: its own, not loopback.
        return os.environ["MONARCH_HOSTNAME"], socket.gethostname(), runtime.current().mailbox.bind_host

    @endpoint
    def echo(self, b):
        return b

    @endpoint
    def ask_host(self, addr, marker):
        # User code trying its proc's keys on another host's agent: a command, and procs of its own there.
        from monarch_agents import messages as m
        from monarch_agents.future import Future
        from monarch_agents.runtime import OneShot
        rt = runtime.current()
        out = []
        for make in (lambda p: m.RunCommand("evil", ["touch", marker], {}, None, p, 0, rt.addr),
                     lambda p: m.SpawnProcs("evil", 1, rt.addr, p, {})):
            fut = Future()
            port = rt.open_port(OneShot(rt, fut))
            rt.send(addr, make(port))
            try:
                fut.get(timeout=10)
                out.append("allowed")
            except PermissionError:
                out.append("refused")
        return out

procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 2})
w = procs.spawn("w", Where)
got = sorted(w.where.call().get().values())
print("WHERE", got)
print("ONE", w.slice(hosts=1, gpus=0).where.call_one().get())
data = os.urandom(8 << 20)
assert w.slice(hosts=1, gpus=1).echo.call_one(data).get() == data
# Several big buffers of odd sizes (bulk streams between hosts: monarch_agents/bulk.py), both ways.
many = [os.urandom((5 << 20) + 3), b"small", os.urandom((1 << 20) + 1), bytearray(os.urandom(6 << 20))]
assert w.slice(hosts=1, gpus=0).echo.call_one(many).get() == many
print("BULK", len(runtime.current().mailbox._fetched_ids) >= 2)
print("INTRUDER", w.slice(hosts=1, gpus=0).ask_host.call_one(HOST0, MARKER).get())
# Every connection of this client went over TCP: no host shares its Unix sockets.
rt = runtime.current()
print("LINKS", sorted({type(p).__name__ for p in rt.mailbox._peers.values()}))
print("CLIENT", rt.mailbox.bind_host)
"""


def test_serve_run_actors_shell_logs_stop_between_namespaces(netns_workdir):
    wd = netns_workdir
    served = _serve(wd)
    plan = _plan(wd)
    ips = [h.ip for h in plan.hosts]
    assert [h["addr"].split("//")[1].split(":")[0] for h in served["hosts"]] == ips
    assert len(set(ips)) == 2 and not any(ip.startswith("127.") for ip in ips)
    assert oct(os.stat(wd / ".monarch" / "jobs" / "default" / "local.json").st_mode & 0o777) == "0o600"
    # Forks of one launcher (not an interpreter each), each inside its own host's network, UTS and
    # mount namespaces, its /etc/hosts the reservation's.
    mine = {k: os.readlink(f"/proc/self/ns/{k}") for k in ("net", "uts", "mnt")}
    pids = [h["pid"] for h in served["hosts"]]
    cmdlines = {open(f"/proc/{pid}/cmdline", "rb").read() for pid in pids}
    assert len(cmdlines) == 1 and b"--fork-hosts" in cmdlines.pop()
    for pid, h in zip(pids, plan.hosts):
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(h.path).st_ino
        assert all(os.readlink(f"/proc/{pid}/ns/{k}") != v for k, v in mine.items())
    with open(f"/proc/{pids[1]}/root/etc/hosts") as f:
        assert f"{ips[1]} host1" in f.read()
    # Run twice on the same agents: each rank sees its own hostname and address.
    for _ in range(2):
        r = monarch("run", "--", "sh", "-c", "echo $(hostname) $MASTER_ADDR; ip -4 -o addr show eth0 | awk '{print $4}'",
                    cwd=wd, check=True, timeout=60)
        assert f"[host0] host0 {ips[0]}" in r.stdout and f"[host1] host1 {ips[0]}" in r.stdout, r.stdout
        assert f"[host1] {ips[1]}/24" in r.stdout, r.stdout
    again = json.loads(monarch("--json", "serve", "--hosts", "2", "--netns", cwd=wd, check=True).stdout)
    assert again["reused"] and [h["pid"] for h in again["hosts"]] == [h["pid"] for h in served["hosts"]]
    # An actor program: procs on both hosts, calls, an 8 MiB echo, all over TCP.
    marker = wd / "evil-ran"
    (wd / "prog.py").write_text(f"HOST0 = {served['hosts'][0]['addr']!r}\nMARKER = {str(marker)!r}\n" + ACTORS)
    r = monarch("run", str(wd / "prog.py"), cwd=wd, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"WHERE [('host0', 'host0', '{ips[0]}'), ('host0', 'host0', '{ips[0]}'), " \
           f"('host1', 'host1', '{ips[1]}'), ('host1', 'host1', '{ips[1]}')]" in r.stdout, r.stdout
    assert f"ONE ('host1', 'host1', '{ips[1]}')" in r.stdout
    assert "LINKS ['_Peer']" in r.stdout  # ZeroMQ peers only
    assert "BULK True" in r.stdout  # the big answers came by bulk streams
    assert "INTRUDER ['refused', 'refused']" in r.stdout and not marker.exists()
    assert f"CLIENT {plan.bridge_ip}" in r.stdout  # the client listens where the hosts can reach it
    # A shell and the logs.
    r = monarch("shell", "--host", "1", "--", "sh", "-c", "echo on $(hostname); exit 4", cwd=wd, stdin=subprocess.DEVNULL)
    assert r.returncode == 4 and "on host1" in r.stdout
    r = monarch("run", "--", "sh", "-c", "echo logged-$NODE_RANK", cwd=wd, check=True)
    r = monarch("logs", "--rank", "1", cwd=wd, check=True)
    assert "logged-1" in r.stdout and "logged-0" not in r.stdout
    # Stop: agents gone, namespaces and bridge removed.
    agents = [h["pid"] for h in served["hosts"]]
    monarch("stop", cwd=wd, check=True)
    assert wait_gone(agents) == []
    assert not netns.exists(plan)
    assert plan.bridge not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


KILLS = """
import os, signal
import monarch.actor
from monarch.actor import Actor, endpoint
from monarch.job import job_load

monarch.actor.unhandled_fault_hook = lambda failure: None  # the failed call says it; the client goes on

class Victim(Actor):
    @endpoint
    def die(self):
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint
    def ok(self):
        return os.environ["MONARCH_HOSTNAME"]

procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 1})
v = procs.spawn("v", Victim)
try:
    v.slice(hosts=1).die.call_one().get(timeout=30)
except Exception as e:
    print("FAILED", type(e).__name__, e)
print("OTHER", v.slice(hosts=0).ok.call_one().get(timeout=30))
"""


def test_supervision_across_hosts(netns_workdir):
    wd = netns_workdir
    served = _serve(wd)
    # A proc killed with SIGKILL on host1: the client's call fails naming the host and the signal.
    (wd / "kills.py").write_text(KILLS)
    r = monarch("run", str(wd / "kills.py"), cwd=wd, timeout=90)
    assert "FAILED SupervisionError" in r.stdout and "host1" in r.stdout and "SIGKILL" in r.stdout, r.stdout + r.stderr
    assert "OTHER host0" in r.stdout
    # The client killed mid-run: the host agents reap its ranks.
    p = _start_run(wd, "sh", "-c", "echo up; exec sleep 62")
    sleepers = _rank_procs("sleep 62")
    assert len(sleepers) == 2
    p.kill()
    p.wait()
    assert wait_gone(sleepers, 15) == []
    # A host agent killed mid-run: the run fails naming the host, and host0's rank is stopped.
    p = _start_run(wd, "sh", "-c", "echo up; exec sleep 63")
    sleepers = _rank_procs("sleep 63")
    os.kill(served["hosts"][1]["pid"], signal.SIGKILL)
    code = p.wait(timeout=30)
    err = p.stderr.read()
    assert code != 0 and "host1" in err, err
    assert wait_gone(sleepers, 10) == []


def test_a_hosts_link_cut_mid_run_then_back(netns_workdir):
    wd = netns_workdir
    _serve(wd)
    plan = _plan(wd)
    p = _start_run(wd, "sh", "-c", "echo up; exec sleep 64")
    sleepers = _rank_procs("sleep 64")
    assert len(sleepers) == 2
    cut = time.monotonic()
    netns.set_link(plan.hosts[1], up=False)
    try:
        code = p.wait(timeout=30)
        noticed = time.monotonic() - cut
        err = p.stderr.read()
        assert code != 0 and "host1" in err, err
        print(f"link cut noticed after {noticed:.1f} s")
        # host0's rank is stopped by the client; host1's by its agent, once it too has lost the client.
        assert wait_gone(sleepers, 15) == []
    finally:
        netns.set_link(plan.hosts[1], up=True)
    # The link is back: the reservation is usable again.
    deadline = time.monotonic() + 20
    while True:
        r = monarch("run", "--", "sh", "-c", "echo back-$NODE_RANK", cwd=wd, timeout=60)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert r.returncode == 0, r.stderr
    assert "[host1] back-1" in r.stdout


def test_netns_needs_root_and_local(workdir, monkeypatch):
    r = monarch("serve", "--netns", "--scheduler", "slurm", cwd=workdir)
    assert r.returncode == 2 and "--netns is for the local scheduler" in r.stderr
    r = monarch("serve", "--netns", "--bind", "127.0.0.1", cwd=workdir)
    assert r.returncode == 2 and "--bind" in r.stderr
    # Not root: one clear error before anything is made or started.
    from types import SimpleNamespace

    from monarch.errors import SchedulerError
    from monarch_schedulers.local import LocalScheduler

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    s = LocalScheduler(netns=True)
    req = s.dryrun(SimpleNamespace(hosts=2, options={}), str(workdir / "job"))
    with pytest.raises(SchedulerError, match="--netns: network namespaces need root"):
        s.allocate(req)
    assert f"monarch-{req.payload['tag']}" not in subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    assert not (workdir / "job" / "local.json").exists()
