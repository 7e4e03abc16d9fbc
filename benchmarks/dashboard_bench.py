"""What `monarch dashboard` costs while it watches a reservation, in one run.

    .venv/bin/python benchmarks/dashboard_bench.py [--hosts 4] [--procs 64] [--seconds 10] [--json]

Serves a local reservation of ``--hosts`` hosts in a temp dir, and a client that holds
``--procs`` proc agents (spread over the hosts, one actor mesh on them) plus a run of
one sleeping rank per host.  Then, for ``--seconds`` each, measures CPU per second of
wall time (user + system):

* idle: the agents (host agents, their zygotes and proc agents) with nobody watching;
* poll only: ``ReservationSource.poll()`` once a second, no UI (what the data costs);
* dashboard: the real app (headless, 120x40) refreshing once a second.

Prints the dashboard's own CPU/s, the agents' CPU/s under each, a poll's p50/p90, and the
ratios to idle and to poll-only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "monarch")
MONARCH = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "monarch_cli.main"]

HOLDER = """
import sys
from monarch.actor import Actor, endpoint
from monarch.job import job_load

class Idle(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

hosts = job_load().state().hosts
procs = hosts.spawn_procs(per_host={"procs": int(sys.argv[1])})
actors = procs.spawn("idle", Idle)
actors.ping.call().get()
print("ready", flush=True)
sys.stdin.read()
procs.stop().get()
"""


def agent_cpu(pids: list[int]) -> float:
    """CPU seconds used so far by the host agents and every process under them."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs = [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
        for q in procs:
            try:
                t = q.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def measure(pids: list[int], seconds: float, body) -> dict:
    a0, c0, w0 = agent_cpu(pids), own_cpu(), time.monotonic()
    extra = body(seconds)
    wall = time.monotonic() - w0
    return {"agents_cpu_per_s": (agent_cpu(pids) - a0) / wall, "own_cpu_per_s": (own_cpu() - c0) / wall,
            "wall_s": wall, **(extra or {})}


def poll_only(source, seconds: float) -> dict:
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        snap = source.poll()
        lat.append(time.monotonic() - t)
        assert snap.banner is None, snap.banner
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    return {"polls": len(lat), "poll_p50_ms": 1000 * statistics.median(lat),
            "poll_p90_ms": 1000 * sorted(lat)[int(0.9 * (len(lat) - 1))]}


def dashboard(source, seconds: float) -> dict:
    from monarch_cli.tui.app import DashboardApp

    app = DashboardApp(source, refresh_s=1.0)

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                await pilot.pause(0.2)

    asyncio.run(go())
    return {"polls": app.polls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--procs", type=int, default=64, help="proc agents in all (spread over the hosts)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    per_host = max(1, args.procs // args.hosts)

    work = tempfile.mkdtemp(prefix="dash-bench-")
    env = {**os.environ, "PYTHONPATH": ROOT}
    holder = run = None
    try:
        subprocess.run([*MONARCH, "serve", "--hosts", str(args.hosts)], cwd=work, env=env, check=True,
                       capture_output=True, timeout=120)
        from monarch.job.reserve import load_live
        from monarch.job.state import StatePaths
        from monarch_cli.tui.source import ReservationSource

        path = StatePaths(work).resolve(None)
        record, _ = load_live(path=path)
        pids = [h.pid for h in record.hosts]
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(per_host)], cwd=work, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if holder.stdout.readline().strip() != "ready":
            raise SystemExit("the client holding the procs did not start")
        run = subprocess.Popen([*MONARCH, "run", "--", sys.executable, "-c", "import time; time.sleep(3600)"],
                               cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2.0)
        source = ReservationSource(path=path)
        source.poll()  # warm: imports, connections
        results = {
            "idle": measure(pids, args.seconds, lambda s: time.sleep(s)),
            "poll_only": measure(pids, args.seconds, lambda s: poll_only(source, s)),
            "dashboard": measure(pids, args.seconds, lambda s: dashboard(source, s)),
        }
        snap = source.poll()
        results["shape"] = {"hosts": len(snap.hosts), "procs": sum(p.kind == "proc" for p in snap.procs),
                            "actors": len(snap.actors), "ranks": sum(p.kind == "rank" for p in snap.procs),
                            "load_1m": os.getloadavg()[0]}
    finally:
        if run is not None:
            run.terminate()
            run.wait(10)
        if holder is not None and holder.poll() is None:
            holder.stdin.close()
            try:
                holder.wait(30)
            except subprocess.TimeoutExpired:
                holder.kill()
        subprocess.run([*MONARCH, "stop", "--force"], cwd=work, env=env, capture_output=True, timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    s, i, p, d = results["shape"], results["idle"], results["poll_only"], results["dashboard"]
    print(f"reservation: {s['hosts']} hosts, {s['procs']} procs, {s['actors']} actors, {s['ranks']} ranks "
          f"(machine load {s['load_1m']:.1f}); {args.seconds:g} s each")
    print(f"{'':12}{'own CPU/s':>11}{'agents CPU/s':>14}")
    for name, r in (("idle", i), ("poll only", p), ("dashboard", d)):
        print(f"{name:12}{r['own_cpu_per_s']:>11.3f}{r['agents_cpu_per_s']:>14.3f}")
    print(f"poll (no UI): p50 {p['poll_p50_ms']:.0f} ms, p90 {p['poll_p90_ms']:.0f} ms; dashboard polls: {d['polls']}")
    print(f"agents CPU with the dashboard / idle: {d['agents_cpu_per_s'] / max(i['agents_cpu_per_s'], 1e-6):.2f}x; "
          f"dashboard CPU / poll-only CPU: {d['own_cpu_per_s'] / max(p['own_cpu_per_s'], 1e-6):.2f}x")


if __name__ == "__main__":
    main()
