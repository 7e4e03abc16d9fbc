"""A Kubernetes reservation reached directly vs through a port-forward, in one run (root only).

    .venv/bin/python benchmarks/kube_bench.py [--n 10] [--calls 200] [--json] [--quick]

On the FAKE Kubernetes cluster of tests/fakes/kube (the only API server that runs here), two
2-pod reservations: one served from this machine, which reaches the pods' IPs (``direct``), and
one served from a network namespace that reaches only the API server, as a laptop outside the
cluster does (``port-forward``: SOCKS proxy -> pods/NAME/portforward WebSocket -> pod, and back
through host rank 0's relay).  Times, in the same rounds:

* warm ``monarch run -- true`` on both pods (p50/p90 wall);
* an actor program's ``call_one`` round trip to the second pod (p50/p99 µs) and a 4 MiB echo
  (MiB/s both ways), from ``monarch run script.py``.

Prints each figure for both and the ratio port-forward / direct.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BIN = os.path.dirname(sys.executable)
MONARCH = os.path.join(BIN, "monarch")
IMAGE = "monarch:bench"

ACTOR_PROGRAM = """
import json, statistics, sys, time
from monarch.actor import Actor, endpoint
from monarch.job import job_load

class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

calls = int(sys.argv[1])
procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 1})
one = procs.spawn("echo", Echo).slice(hosts=1, gpus=0)
one.echo.call_one(0).get()
ts = []
for i in range(calls):
    t = time.perf_counter()
    one.echo.call_one(i).get()
    ts.append(time.perf_counter() - t)
ts.sort()
blob = b"x" * (4 << 20)
one.echo.call_one(blob).get()
t = time.perf_counter()
for _ in range(5):
    one.echo.call_one(blob).get()
mibps = 5 * 2 * 4 / (time.perf_counter() - t)
print(json.dumps({"call_one_p50_us": ts[len(ts) // 2] * 1e6, "call_one_p99_us": ts[int(len(ts) * 0.99)] * 1e6,
                  "echo_4MiB_MiBps": mibps}))
procs.stop().get()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10, help="rounds of `monarch run -- true`")
    p.add_argument("--calls", type=int, default=200, help="call_one round trips")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="2 rounds, 20 calls (the test suite's smoke run)")
    a = p.parse_args()
    if a.quick:
        a.n, a.calls = 2, 20
    from monarch_schedulers import netns
    from tests.fakes.kube.cluster import FakeCluster

    why = netns.unavailable()
    if why:
        sys.exit(f"kube_bench: {why}")
    work = tempfile.mkdtemp(prefix="kube-bench-")
    plan = netns.create(f"kb{os.getpid() % 100000}", 1)
    laptop = plan.hosts[0]
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"]}
    cluster = FakeCluster(work, [IMAGE], env=env, host=plan.bridge_ip).start()
    dirs = {"direct": os.path.join(work, "direct"), "port-forward": os.path.join(work, "outside")}
    prefix = {"direct": [], "port-forward": netns.enter_argv(laptop, [])}
    for d in dirs.values():
        os.makedirs(d)
    with open(os.path.join(work, "echo.py"), "w") as f:
        f.write(ACTOR_PROGRAM)

    def monarch(kind: str, *args: str) -> subprocess.CompletedProcess:
        r = subprocess.run([*prefix[kind], MONARCH, *args], cwd=dirs[kind], capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"kube_bench: monarch {' '.join(args)} ({kind}) failed: {r.stderr.strip()[-500:]}")
        return r

    served = []
    try:
        for kind in dirs:
            monarch(kind, "serve", "--scheduler", "kubernetes", "--hosts", "2", "--image", IMAGE,
                    "--kubeconfig", cluster.kubeconfig, "--timeout", "120", "--reach", kind)
            served.append(kind)
        runs: dict[str, list[float]] = {k: [] for k in dirs}
        for kind in dirs:
            monarch(kind, "run", "--", "true")  # warm: the forward's first streams, the agents' zygotes
        for _ in range(a.n):
            for kind in dirs:
                t = time.perf_counter()
                monarch(kind, "run", "--", "true")
                runs[kind].append(time.perf_counter() - t)
        actors = {kind: json.loads(monarch(kind, "run", os.path.join(work, "echo.py"), str(a.calls)).stdout
                                   .strip().splitlines()[-1]) for kind in dirs}
    finally:
        for kind in served:
            subprocess.run([*prefix[kind], MONARCH, "stop"], cwd=dirs[kind], capture_output=True, timeout=120)
        cluster.stop()
        netns.remove(plan)
        shutil.rmtree(work, ignore_errors=True)

    def q(xs: list[float], f: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(len(xs) * f))]

    rows = {
        "run_p50_ms": {k: q(v, 0.5) * 1e3 for k, v in runs.items()},
        "run_p90_ms": {k: q(v, 0.9) * 1e3 for k, v in runs.items()},
        **{key: {k: actors[k][key] for k in dirs} for key in ("call_one_p50_us", "call_one_p99_us", "echo_4MiB_MiBps")},
    }
    out = {key: {**v, "ratio": v["port-forward"] / v["direct"]} for key, v in rows.items()}
    out["load"] = os.getloadavg()[0]
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{'':18} {'direct':>12} {'port-forward':>14} {'ratio':>8}   (load {out['load']:.1f})")
    for key, v in rows.items():
        print(f"{key:18} {v['direct']:12.1f} {v['port-forward']:14.1f} {out[key]['ratio']:8.2f}")
    print(f"{a.n} warm runs, {a.calls} calls, per reservation")


if __name__ == "__main__":
    main()
