#!/usr/bin/env python
"""Tensor engine and RDMABuffer benchmarks, against this monarch or PyTorch Monarch (torchmonarch).

    .venv/bin/python benchmarks/tensor_bench.py                  # ours, table
    .venv/bin/python benchmarks/tensor_bench.py --quick --json   # ours, few iterations, JSON on stdout
    .venv/bin/python benchmarks/tensor_bench.py --compare        # both in one run, with ratios
    .venv/bin/python benchmarks/tensor_bench.py --compare --torchmonarch-python tm/bin/python

Both packages import as ``monarch``, so each implementation runs in an interpreter of its
own: this script runs itself with ``--child`` under each and reads its JSON back.  On a
4-proc mesh of this host (``per_host={"gpus": 4}``), what is measured:

* ``issue_ops_s``: small ops (``x = x + 1`` on a 4-element tensor) the controller issues per
  second, 5,000 of them, before anything is waited for;
* ``e2e_ops_s``: the same 5,000 ops divided by the time until a fetch of the result is back
  (issue plus every proc running them);
* ``fetch_p50_us``: ``fetch_shard(x).result()`` of a small tensor, median of 200;
* ``reduce_64MiB_ms``: ``reduce(t, "gpus", "sum")`` of a 64 MiB float32 tensor over the 4 procs
  until a fetch of one element of the result is back, best of 3;
* ``rdma_read_1MiB_MBps`` / ``rdma_read_256MiB_MBps``: ``RDMABuffer.read_into`` by an actor
  of one proc from an actor of another proc of this host, best of N, MB/s = bytes / 1e6 / s;
* with ``--netns`` (root; ours only: it serves ``monarch serve --hosts 2 --netns``), the same reads
  between procs of two hosts in network namespaces of their own (TCP + CURVE, as between machines).

A measurement that fails in one implementation is reported as its error (torchmonarch 0.7.0
cannot reduce on CPU: its workers need NCCL communicators) and the run goes on; a
measurement that hangs is cut off after ``--step-timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
#: torchmonarch's interpreter: $TORCHMONARCH_PYTHON, else a .tm-venv at the root (as tests/compat look).
DEFAULT_TM_PYTHON = os.environ.get("TORCHMONARCH_PYTHON") or os.path.join(REPO, ".tm-venv", "bin", "python")
MiB = 1 << 20

METRICS = [
    ("issue_ops_s", "ops issued by the controller", "ops/s", "rate"),
    ("e2e_ops_s", "ops issued and run on 4 procs", "ops/s", "rate"),
    ("fetch_p50_us", "fetch_shard round trip p50", "us", "time"),
    ("reduce_64MiB_ms", "reduce 64 MiB over 4 procs (sum)", "ms", "time"),
    ("rdma_read_1MiB_MBps", "RDMABuffer.read_into 1 MiB, same host", "MB/s", "rate"),
    ("rdma_read_256MiB_MBps", "RDMABuffer.read_into 256 MiB, same host", "MB/s", "rate"),
    ("rdma_read_1MiB_netns_MBps", "RDMABuffer.read_into 1 MiB, across --netns hosts", "MB/s", "rate"),
    ("rdma_read_256MiB_netns_MBps", "RDMABuffer.read_into 256 MiB, across --netns hosts", "MB/s", "rate"),
]


def log(msg: str) -> None:
    print(f"[tensor_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the child: one implementation ---------------------------------------------------------------


def _actors() -> tuple[type, type]:
    import torch
    from monarch.actor import Actor, endpoint
    from monarch.rdma import RDMABuffer

    class Owner(Actor):
        def __init__(self, n: int):
            self.t = torch.ones(n, dtype=torch.uint8)
            self.buf = None

        @endpoint
        def handle(self) -> Any:
            self.buf = RDMABuffer(self.t)
            return self.buf

    class Reader(Actor):
        @endpoint
        def read(self, buf: Any, n: int, reps: int) -> list:
            dst = torch.empty(n, dtype=torch.uint8)
            buf.read_into(dst).get()  # warm: first touch of dst, connections
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                buf.read_into(dst).get()
                times.append(time.perf_counter() - t0)
            assert int(dst[:1024].sum()) == 1024
            return times

    return Owner, Reader


class _Watchdog:
    """Ends the child if one measurement hangs, after reporting what is known (the mesh may be wedged:
    torchmonarch's client blocks when its workers fail).  Measurements run in the main thread, where
    both implementations expect their client to be used."""

    def __init__(self, seconds: float, on_timeout: Callable[[], None]):
        self.seconds = seconds
        self.on_timeout = on_timeout

    def run(self, fn: Callable[[], Any]) -> Any:
        timer = threading.Timer(self.seconds, self._fire)
        timer.daemon = True
        timer.start()
        try:
            return fn()
        finally:
            timer.cancel()

    def _fire(self) -> None:
        try:
            self.on_timeout()
        finally:
            os._exit(0)


class _Skip(Exception):
    pass


def child(args: argparse.Namespace) -> int:
    import warnings

    warnings.simplefilter("ignore")
    import torch
    from monarch import fetch_shard, inspect, reduce
    from monarch.actor import this_host

    import monarch.actor

    quick = args.quick
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    # torchmonarch's default hook exits the client on a failure it is told of (its CPU reduce is one).
    monarch.actor.unhandled_fault_hook = lambda failure: log(f"{args.impl}: told of a failure: {failure}")
    if args.job_state:
        from monarch.job import job_load

        procs = job_load(args.job_state).state().hosts.spawn_procs(per_host={"gpus": 1})
        owner_of, reader_of, suffix = procs.slice(hosts=0), procs.slice(hosts=1), "_netns"
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 4})
        owner_of, reader_of, suffix = procs.slice(gpus=0), procs.slice(gpus=1), ""

    def report() -> None:
        # After every measurement: what is known so far survives a client that dies on the next one.
        print(json.dumps({"impl": args.impl, "results": results, "errors": errors, "load": os.getloadavg()}),
              flush=True)

    current = [""]

    def hung() -> None:
        errors[current[0]] = f"TimeoutError: no result within {args.step_timeout:.0f} s"
        log(f"{args.impl}: {current[0]} hung; ending")
        report()

    watchdog = _Watchdog(args.step_timeout, hung)

    def measure(key: str, fn: Callable[[], float]) -> None:
        current[0] = key
        try:
            results[key] = watchdog.run(fn)
            log(f"{args.impl}: {key} = {results[key]:.1f}")
        except Exception as e:
            errors[key] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
            log(f"{args.impl}: {key} failed: {errors[key]}")
        report()

    n_ops = 500 if quick else 5000
    tensors = not args.job_state

    def ops() -> tuple[float, float]:
        with procs.activate():
            x = torch.zeros(4)
            inspect(x)
            t0 = time.perf_counter()
            for _ in range(n_ops):
                x = x + 1
            t1 = time.perf_counter()
            v = inspect(x)
            t2 = time.perf_counter()
        assert float(v[0]) == n_ops, v  # outside the block: torchmonarch refuses local ops inside it
        return n_ops / (t1 - t0), n_ops / (t2 - t0)

    current[0] = "issue_ops_s"
    try:
        if not tensors:
            raise _Skip()
        issue, e2e = watchdog.run(ops)
        results["issue_ops_s"], results["e2e_ops_s"] = issue, e2e
        log(f"{args.impl}: issue {issue:.0f} ops/s, end to end {e2e:.0f} ops/s")
    except _Skip:
        pass
    except Exception as e:
        errors["issue_ops_s"] = errors["e2e_ops_s"] = f"{type(e).__name__}: {e}"[:300]
    report()

    def fetch() -> float:
        with procs.activate():
            y = torch.ones(4) * 2
            fetch_shard(y).result()
            times = []
            for _ in range(20 if quick else 200):
                t0 = time.perf_counter()
                fetch_shard(y).result()
                times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1e6

    if tensors:
        measure("fetch_p50_us", fetch)

    owner_cls, reader_cls = _actors()
    for name, n, reps in (("1MiB", MiB, 5 if quick else 50), ("256MiB", 256 * MiB, 1 if quick else 5)):
        if quick and n > 16 * MiB:
            n = 16 * MiB  # the smoke run keeps the key, with a smaller buffer

        def rdma(n: int = n, reps: int = reps) -> float:
            owner = owner_of.spawn(f"owner{n}", owner_cls, n)
            reader = reader_of.spawn(f"reader{n}", reader_cls)
            buf = owner.handle.call_one().get()
            times = reader.read.call_one(buf, n, reps).get()
            return n / 1e6 / min(times)

        measure(f"rdma_read_{name}{suffix}_MBps", rdma)

    # Last: torchmonarch's reduce fails its workers on CPU, and the mesh is unusable after.
    def reduce_64() -> float:
        best = float("inf")
        with procs.activate():
            big = torch.ones((4 if quick else 64) * MiB // 4)
            inspect(big[:1])
            for _ in range(1 if quick else 3):
                t0 = time.perf_counter()
                r = reduce(big, "gpus", reduction="sum")
                v = inspect(r[:1])
                best = min(best, time.perf_counter() - t0)
        assert float(v[0]) == 4.0, v
        return best * 1000

    if tensors:
        measure("reduce_64MiB_ms", reduce_64)
    report()
    current[0] = "stop"
    try:
        _Watchdog(30, lambda: None).run(lambda: procs.stop().get())
    except Exception:
        os._exit(0)
    return 0


# --- the parent: run children, print ----------------------------------------------------------------


def run_child(impl: str, python: str, args: argparse.Namespace, job_state: str | None = None) -> dict:
    cmd = [python, os.path.abspath(__file__), "--child", "--impl", impl, "--step-timeout", str(args.step_timeout)]
    if job_state:
        cmd += ["--job-state", job_state]
    if args.quick:
        cmd.append("--quick")
    env = dict(os.environ)
    if impl == "torchmonarch":
        env.pop("PYTHONPATH", None)
    log(f"running {impl} ({python})")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.step_timeout * 8 + 120,
                           cwd="/" if impl == "torchmonarch" else REPO, env=env)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "results": {}, "errors": {"run": "timed out"}}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            out = json.loads(line)
            if p.returncode != 0:
                out["errors"]["exit"] = f"the {impl} client exited {p.returncode} after these: {p.stderr[-300:]}"
            return out
    return {"impl": impl, "results": {}, "errors": {"run": f"exit {p.returncode}: {p.stderr[-1500:]}"}}


def _netns_run(args: argparse.Namespace) -> dict:
    """Our RDMA reads between two hosts of a ``monarch serve --hosts 2 --netns`` reservation."""
    import tempfile

    cli = [sys.executable, "-m", "monarch_cli.main"]
    with tempfile.TemporaryDirectory(prefix="tensor_bench_netns_") as d:
        r = subprocess.run([*cli, "serve", "--hosts", "2", "--netns"], cwd=d, capture_output=True, text=True,
                           timeout=180)
        if r.returncode != 0:
            return {"results": {}, "errors": {"netns": f"could not serve --netns hosts: {r.stderr.strip()[-300:]}"}}
        try:
            return run_child("monarch", sys.executable, args, os.path.join(d, ".monarch", "job_state.pkl"))
        finally:
            subprocess.run([*cli, "stop"], cwd=d, capture_output=True, timeout=120)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:,.2f}"


def _cell(run: dict | None, key: str, v: Any) -> str:
    if run is None or (v is None and key not in run.get("errors", {})):
        return "-"  # not measured there
    return _fmt(v) if v is not None else "failed"


def render(ours: dict, theirs: dict | None) -> str:
    rows = [("measurement", "unit", "monarch", "torchmonarch", "ours vs theirs")]
    for key, label, unit, kind in METRICS:
        a = ours["results"].get(key)
        b = theirs["results"].get(key) if theirs else None
        ratio = ""
        if a is not None and b is not None and a > 0 and b > 0:
            ratio = f"{(a / b if kind == 'rate' else b / a):.2f}x " + ("faster" if (a > b) == (kind == "rate") else
                                                                        "slower")
        elif theirs is not None and b is None:
            ratio = "theirs failed" if key in theirs.get("errors", {}) else ""
        rows.append((label, unit, _cell(ours, key, a), _cell(theirs, key, b), ratio))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for run in (ours, theirs):
        if run:
            for k, e in run.get("errors", {}).items():
                lines.append(f"{run['impl']} {k}: {e}")
            if "load" in run:
                lines.append(f"{run['impl']}: load average at the end {run['load'][0]:.1f} ({os.cpu_count()} CPUs)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=["monarch", "torchmonarch"], default="monarch")
    ap.add_argument("--compare", action="store_true", help="run both implementations, print ratios")
    ap.add_argument("--torchmonarch-python", default=DEFAULT_TM_PYTHON,
                    help="the interpreter that has torchmonarch installed")
    ap.add_argument("--quick", action="store_true", help="few iterations, small sizes (the smoke test)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--step-timeout", type=float, default=120.0, help="seconds one measurement may take")
    ap.add_argument("--netns", action="store_true",
                    help="also read RDMABuffers across two --netns hosts (root; ours only)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job-state", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if (args.compare or args.impl == "torchmonarch") and not os.path.exists(args.torchmonarch_python):
        print(f"error: no torchmonarch interpreter at {args.torchmonarch_python} (--torchmonarch-python)",
              file=sys.stderr)
        return 2
    load0 = os.getloadavg()
    ours = theirs = None
    if args.impl == "monarch" or args.compare:
        ours = run_child("monarch", sys.executable, args)
        if args.netns:
            cross = _netns_run(args)
            ours["results"].update(cross["results"])
            ours["errors"].update(cross["errors"])
    if args.impl == "torchmonarch" or args.compare:
        theirs = run_child("torchmonarch", args.torchmonarch_python, args)
    if args.json:
        print(json.dumps({"impl": "compare" if args.compare else args.impl, "ours": ours, "theirs": theirs,
                          "results": (ours or theirs)["results"], "errors": (ours or theirs)["errors"],
                          "load_before": load0}))
    else:
        if ours is None:
            ours, theirs = theirs, None
        print(f"load average before: {load0[0]:.1f} ({os.cpu_count()} CPUs)")
        print(render(ours, theirs))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
