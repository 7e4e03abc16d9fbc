"""`monarch run` overhead, in one run: monarch vs the bare command vs torchrun cold start.

    .venv/bin/python benchmarks/run_bench.py [--n 15] [--json]

Serves a 2-host local reservation in a temp dir, then times (p50/p90 wall):
`python -c pass` bare; `monarch run -- python -c pass` on both hosts;
`torchrun --standalone --nproc-per-node=1 -c pass`-equivalent cold start; and
`monarch status`. Prints monarch's overhead over the bare command and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MONARCH = [sys.executable, "-m", "monarch_cli.main"]


def timed(cmd: list[str], cwd: str, n: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return out


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"p50_ms": round(statistics.median(xs) * 1000, 1), "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PYTHONPATH": ROOT}
        subprocess.run([*MONARCH, "serve", "--hosts", "2"], cwd=d, env=env, check=True, stderr=subprocess.DEVNULL)
        try:
            res = {
                "bare python -c pass": summary(timed([sys.executable, "-c", "pass"], d, a.n)),
                "monarch run -- python -c pass (2 hosts)": summary(timed([*MONARCH, "run", "--", sys.executable, "-c", "pass"], d, a.n)),
                "torchrun --standalone cold start": summary(timed([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                                   "--nproc-per-node=1", "--no-python", "true"], d, max(3, a.n // 3))),
                "monarch status": summary(timed([*MONARCH, "status"], d, a.n)),
            }
        finally:
            subprocess.run([*MONARCH, "stop"], cwd=d, env=env, stderr=subprocess.DEVNULL)
    bare = res["bare python -c pass"]["p50_ms"]
    mon = res["monarch run -- python -c pass (2 hosts)"]["p50_ms"]
    tr = res["torchrun --standalone cold start"]["p50_ms"]
    ratios = {"monarch overhead over bare (ms, p50)": round(mon - bare, 1),
              "monarch run / torchrun cold start": round(mon / tr, 3)}
    if a.json:
        print(json.dumps({"results": res, "ratios": ratios}, indent=2))
        return
    for k, v in res.items():
        print(f"{k:45s} p50 {v['p50_ms']:8.1f} ms   p90 {v['p90_ms']:8.1f} ms")
    for k, v in ratios.items():
        print(f"{k:45s} {v}")


if __name__ == "__main__":
    main()
