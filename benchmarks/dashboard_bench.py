"""What `monarch dashboard` costs while it watches a reservation, in one run.

    .venv/bin/python benchmarks/dashboard_bench.py [--hosts 4] [--procs 64] [--seconds 10] [--json]
    .venv/bin/python benchmarks/dashboard_bench.py --frozen [--procs 1000] [--seconds 10] [--json]

Serves a local reservation of ``--hosts`` hosts in a temp dir, and a client that holds
``--procs`` proc agents (spread over the hosts, one actor mesh on them) plus a run of
one sleeping rank per host.  Then, for ``--seconds`` each, measures CPU per second of
wall time (user + system):

* idle: the agents (host agents, their zygotes and proc agents) with nobody watching;
* poll only: ``ReservationSource.poll()`` once a second, no UI (what the data costs);
* dashboard: the real app (headless, 120x40) refreshing once a second.

Prints the dashboard's own CPU/s, the agents' CPU/s under each, a poll's p50/p90, and the
ratios to idle and to poll-only.

``--frozen``: the dashboard's own refresh cost at ``--procs`` (1,000) against the 64-proc
case, on 4 hosts, when a live reservation that large does not fit the machine.  Both are
the recorded real reservation of tests/tui/frozen_source.py scaled up (one actor per
proc), read through the dashboard's SQL.  Each runs the real app (headless, 120x40) for
``--seconds`` at one refresh a second, twice: steady (nothing changes) and churn (every
proc's rss moves each refresh, as a live one's does, so every proc's label changes).
Prints per refresh: the CPU of the poll (its SQL, in the poll thread), of applying it to
the widgets (``apply_snapshot``, UI thread) and of the whole process, and 1,000/64 ratios.
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


def frozen_refresh(directory: str, seconds: float, churn: bool) -> dict:
    """CPU per refresh of the real app on a frozen reservation: poll thread, apply_snapshot, whole process."""
    from monarch_cli.tui.app import DashboardApp
    from monarch_cli.tui.mesh_tree import MeshTree
    from tests.tui.frozen_source import FrozenReservationSource

    source = FrozenReservationSource(directory)
    source.poll()  # warm: imports, the tables read once
    cpu = {"poll": 0.0, "apply": 0.0, "refreshes": 0, "relabelled": 0}
    poll = source.poll

    def timed_poll():
        t = time.thread_time()
        snap = poll()
        if churn:
            for p in snap.procs:
                if p.rss_bytes:
                    p.rss_bytes += 1_000_000 * (cpu["refreshes"] + 1)
        cpu["poll"] += time.thread_time() - t
        return snap

    source.poll = timed_poll
    app = DashboardApp(source, refresh_s=1.0)
    apply = app.apply_snapshot

    def timed_apply(snap, logs):
        t = time.thread_time()
        apply(snap, logs)
        cpu["apply"] += time.thread_time() - t
        cpu["refreshes"] += 1
        cpu["relabelled"] += app.query_one(MeshTree).statistics().relabelled

    app.apply_snapshot = timed_apply

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            while cpu["refreshes"] < 2:  # the first refresh builds the tree: not a steady-state one
                await pilot.pause(0.1)
            for k in ("poll", "apply", "relabelled"):
                cpu[k] = 0.0
            cpu["refreshes"] = 0
            c0, w0 = own_cpu(), time.monotonic()
            end = w0 + seconds
            while time.monotonic() < end:
                await pilot.pause(0.2)
            cpu["process_per_s"] = (own_cpu() - c0) / (time.monotonic() - w0)

    asyncio.run(go())
    n = max(1, cpu["refreshes"])
    return {"refreshes": cpu["refreshes"], "poll_ms": 1000 * cpu["poll"] / n, "apply_ms": 1000 * cpu["apply"] / n,
            "relabelled_per_refresh": cpu["relabelled"] / n, "process_cpu_per_s": cpu["process_per_s"]}


def frozen_main(args: argparse.Namespace) -> None:
    from tests.tui.frozen_source import FROZEN_DIR, scale_procs

    work = tempfile.mkdtemp(prefix="dash-bench-frozen-")
    results: dict = {}
    try:
        for procs in (64, args.procs):
            d = os.path.join(work, str(procs))
            scale_procs(FROZEN_DIR, d, 4, procs)
            for mode in ("steady", "churn"):
                results[f"{procs}/{mode}"] = frozen_refresh(d, args.seconds, mode == "churn")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"frozen reservation, 4 hosts, 64 vs {args.procs} procs (one actor each); {args.seconds:g} s each, "
          f"1 refresh/s (machine load {os.getloadavg()[0]:.1f})")
    print(f"{'procs/mode':16}{'refreshes':>10}{'relabelled':>11}{'poll ms':>9}{'apply ms':>10}{'process CPU/s':>15}")
    for key, r in results.items():
        print(f"{key:16}{r['refreshes']:>10}{r['relabelled_per_refresh']:>11.0f}{r['poll_ms']:>9.1f}"
              f"{r['apply_ms']:>10.1f}{r['process_cpu_per_s']:>15.3f}")
    for mode in ("steady", "churn"):
        big, small = results[f"{args.procs}/{mode}"], results[f"64/{mode}"]
        print(f"{mode}: {args.procs}/64 procs: poll {big['poll_ms'] / max(small['poll_ms'], 1e-6):.1f}x, "
              f"apply {big['apply_ms'] / max(small['apply_ms'], 1e-6):.1f}x, "
              f"process CPU {big['process_cpu_per_s'] / max(small['process_cpu_per_s'], 1e-6):.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--procs", type=int, default=None,
                    help="proc agents in all, spread over the hosts (default 64; with --frozen 1000)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--frozen", action="store_true",
                    help="the app's refresh cost on a recorded reservation scaled to --procs, against 64 procs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.frozen:
        args.procs = args.procs or 1000
        frozen_main(args)
        return
    args.procs = args.procs or 64
    per_host = max(1, args.procs // args.hosts)

    work = tempfile.mkdtemp(prefix="dash-bench-")
    env = {**os.environ, "PYTHONPATH": ROOT}
    holder = run = None
    try:
        subprocess.run([*MONARCH, "serve", "--hosts", str(args.hosts)], cwd=work, env=env, check=True,
                       capture_output=True, timeout=120)
        from monarch._workbench.reserve import load_live
        from monarch._workbench.state import StatePaths
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
