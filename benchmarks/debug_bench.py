"""`monarch debug` latency, in one run: attach and pdb round trips through the agents vs a local pdb.

    .venv/bin/python benchmarks/debug_bench.py [--n 30] [--json]

Serves a 2-host local reservation in a temp dir and runs a program whose rank on host 1
stops in breakpoint().  Then times (p50/p90):

* attach (API): ``DebugClient.attach`` until the rank's ``(Pdb)`` prompt is in hand, then detach;
* attach (CLI): in one ``monarch debug``, from ``attach 0`` typed at ``monarch_dbg>`` until it
  prints the rank's ``(Pdb)`` prompt: what a user waits for;
* command round trip: ``p x`` sent until the answer and the next prompt arrive, through the
  client, the host agent and the rank's debug socket;
* baseline: the same ``p x`` round trip with a local pdb over pipes (``python -c breakpoint()``).

Prints the figures and the ratios to the local pdb round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "monarch")
MONARCH = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "monarch_cli.main"]
PROGRAM = "import os\nx = 41 + int(os.environ['NODE_RANK'])\nif os.environ['NODE_RANK'] == '1':\n    breakpoint()\n"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def read_until(fd: int, marker: bytes, timeout: float = 30.0) -> bytes:
    buf = b""
    end = time.monotonic() + timeout
    while marker not in buf:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"no {marker!r} within {timeout} s: {buf[-500:]!r}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise EOFError(f"closed before {marker!r}: {buf[-500:]!r}")
        buf += chunk
    return buf


def local_pdb_round_trips(n: int) -> list[float]:
    """``p x`` on a local pdb whose stdin/stdout are pipes: the floor any relay adds to."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONBREAKPOINT"}
    p = subprocess.Popen([sys.executable, "-c", "x = 41\nbreakpoint()\n"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    fd = p.stdout.fileno()
    try:
        read_until(fd, b"(Pdb) ")
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            p.stdin.write(b"p x\n")
            p.stdin.flush()
            read_until(fd, b"(Pdb) ")
            times.append(time.perf_counter() - t0)
        p.stdin.write(b"c\n")
        p.stdin.flush()
        p.wait(timeout=10)
        return times
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def relay_measures(workdir: str, n: int) -> dict[str, list[float]]:
    """Attach (API) and ``p x`` round trips through the agents, on the paused rank."""
    os.chdir(workdir)
    from monarch._workbench.debug import DebugClient
    from monarch._workbench.reserve import load_live

    record, _ = load_live(None)
    client = DebugClient(record)
    deadline = time.monotonic() + 60
    while True:
        sessions = [s for s in client.refresh() if s.waiting]
        if sessions:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("the rank never stopped in breakpoint()")
        time.sleep(0.05)
    s = sessions[0]
    attach, rtt = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        a = client.attach(s)
        if not a.waiting:
            a.run_until_waiting(None, timeout=30)
        attach.append(time.perf_counter() - t0)
        a.detach()
    a = client.attach(s)
    for _ in range(n):
        t0 = time.perf_counter()
        out, ended = a.run_until_waiting("p x", timeout=30)
        rtt.append(time.perf_counter() - t0)
        assert out.startswith(b"42\n") and ended is None, (out, ended)
    a.detach()
    return {"attach_api": attach, "relay_round_trip": rtt}


def cli_attach(workdir: str, n: int) -> list[float]:
    """In one `monarch debug`: from `attach 0` typed at monarch_dbg> to the rank's (Pdb) prompt shown."""
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    p = subprocess.Popen([*MONARCH, "debug"], cwd=workdir, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    fd = p.stdout.fileno()
    times = []
    try:
        read_until(fd, b"monarch_dbg> ")
        for _ in range(n):
            t0 = time.perf_counter()
            p.stdin.write(b"attach 0\n")
            p.stdin.flush()
            read_until(fd, b"(Pdb) ")
            times.append(time.perf_counter() - t0)
            p.stdin.write(b"detach\n")
            p.stdin.flush()
            read_until(fd, b"monarch_dbg> ")
        p.stdin.write(b"quit\n")
        p.stdin.close()
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="rounds of each measure")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="debug-bench-") as d:
        subprocess.run([*MONARCH, "serve", "--hosts", "2"], cwd=d, env=env, check=True, capture_output=True, timeout=120)
        with open(os.path.join(d, "prog.py"), "w") as f:
            f.write(PROGRAM)
        run = subprocess.Popen([*MONARCH, "run", "--", sys.executable, "prog.py"], cwd=d, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            times = relay_measures(d, args.n)
            times["attach_cli"] = cli_attach(d, args.n)
            times["local_pdb_round_trip"] = local_pdb_round_trips(args.n)
            subprocess.run([*MONARCH, "debug"], input=b"continue\nquit\n", cwd=d, env=env, capture_output=True,
                           timeout=60)
            run.wait(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
            subprocess.run([*MONARCH, "stop"], cwd=d, env=env, capture_output=True, timeout=60)
    for name, xs in times.items():
        results[f"{name}_p50_ms"] = statistics.median(xs) * 1e3
        results[f"{name}_p90_ms"] = pct(xs, 0.9) * 1e3
    base = results["local_pdb_round_trip_p50_ms"]
    results["relay_round_trip_vs_local_pdb"] = results["relay_round_trip_p50_ms"] / base
    results["attach_api_vs_local_pdb"] = results["attach_api_p50_ms"] / base
    results["attach_cli_vs_local_pdb"] = results["attach_cli_p50_ms"] / base
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'measure':32} {'p50 ms':>9} {'p90 ms':>9}")
    for name in times:
        print(f"{name:32} {results[f'{name}_p50_ms']:9.2f} {results[f'{name}_p90_ms']:9.2f}")
    print(f"\nrelay round trip / local pdb round trip: {results['relay_round_trip_vs_local_pdb']:.1f}x")
    print(f"attach (API) / local pdb round trip:     {results['attach_api_vs_local_pdb']:.1f}x")
    print(f"attach (CLI) / local pdb round trip:     {results['attach_cli_vs_local_pdb']:.1f}x")


if __name__ == "__main__":
    main()
