#!/usr/bin/env python
"""What one message costs each end of the hot path: CPU time, or instructions (callgrind).

    .venv/bin/python benchmarks/hotpath_cost.py                       # CPU us per call, client and proc
    .venv/bin/python benchmarks/hotpath_cost.py --callgrind client    # instructions per call in the client
    .venv/bin/python benchmarks/hotpath_cost.py --callgrind proc      # ... in the proc

Two workloads on a one-proc mesh (the same endpoint as ``actor_bench.py``'s ``ping``):
``outstanding`` issues ``--calls`` ``call_one`` futures, then gets them all (actor_bench's
throughput); ``roundtrip`` waits for each answer before the next call.

CPU time (``utime + stime`` of the whole process, every thread, from /proc) depends less on
the machine's load than wall-clock rates, but still on how messages batch.  Instructions
(valgrind's callgrind, counting only while the workload runs: ``--instr-atstart=no``, and
callgrind's client requests around it, made from the measured process) do not depend on load; under valgrind the measured
end runs ~50x slower, so the other end keeps up and messages batch as they do when that end
is the bottleneck.  ``--callgrind proc`` runs the host agent (and so the zygote and the proc it
forks) under valgrind.  Use ``--json`` for a line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TICK = os.sysconf("SC_CLK_TCK")
_VG_ENV = "HOTPATH_COST_UNDER_VALGRIND"


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


_CG_C = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_stop(const char *why) { CALLGRIND_DUMP_STATS_AT(why); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def build_cg_lib(folder: str) -> str:
    """A tiny library that makes callgrind's client requests (start counting; dump and stop) from Python:
    valgrind's own controller (vgdb) does not reach a forked process, which a proc is."""
    src, lib = os.path.join(folder, "cg.c"), os.path.join(folder, "cg.so")
    with open(src, "w") as f:
        f.write(_CG_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib, src], check=True)
    return lib


def callgrind(lib: str, op: str, why: str = "") -> None:
    import ctypes

    cg = ctypes.CDLL(lib)
    if op == "start":
        cg.cg_start()
    else:
        cg.cg_stop(why.encode())


def cg_dump(path: str) -> tuple[str, int]:
    """A callgrind output file's trigger (``CALLGRIND_DUMP_STATS_AT(why)`` names it) and instruction count."""
    total, why = 0, ""
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("desc: Trigger:"):
                why = line.split(":", 2)[2].strip()
            elif line.startswith(("totals:", "summary:")):
                total = max(total, int(line.split()[1]))
    return why, total


def define_actor() -> Any:
    from monarch.actor import Actor, endpoint

    class Bench(Actor):
        @endpoint
        def ping(self, x: Any = None) -> Any:
            return x

        @endpoint
        def pid(self) -> int:
            return os.getpid()

        @endpoint
        def callgrind(self, lib: str, op: str, why: str = "") -> None:
            callgrind(lib, op, why)

    return Bench


def workload(actor: Any, mode: str, n: int) -> None:
    if mode == "outstanding":
        for f in [actor.ping.call_one(i) for i in range(n)]:
            f.get(timeout=600)
    else:
        for i in range(n):
            actor.ping.call_one(i).get(timeout=600)


def run(args: argparse.Namespace) -> dict:
    if not args.no_torch:
        try:
            import torch  # noqa: F401  (as actor_bench does: imported before any proc exists)
        except ImportError:
            pass
    vg_dir = os.environ.get(_VG_ENV, "")
    if args.callgrind == "proc":
        # The host agent runs under valgrind; its zygote and procs are forks of it, so they do too.
        wrapper = os.path.join(vg_dir, "python")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no "
                    f"--callgrind-out-file={vg_dir}/proc.%p {sys.executable} \"$@\"\n")
        os.chmod(wrapper, 0o700)
        sys.executable = wrapper
    from monarch.actor import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    out: dict = {"calls": args.calls, "load": os.getloadavg()[0]}
    try:
        actor = procs.spawn("cost", define_actor())
        proc_pid = actor.pid.call_one().get(timeout=600)
        print(f"hotpath_cost: client pid {os.getpid()}, proc pid {proc_pid}", file=sys.stderr, flush=True)
        for mode in args.modes:
            workload(actor, mode, min(args.calls, 1000))  # warm up
            if args.callgrind:
                lib = os.path.join(vg_dir, "cg.so")
                # A dump that names the workload; counting starts from zero for the next one.
                if args.callgrind == "client":
                    callgrind(lib, "start")
                    workload(actor, mode, args.calls)
                    callgrind(lib, "stop", f"workload-{mode}")
                else:
                    actor.callgrind.call_one(lib, "start").get(timeout=600)
                    workload(actor, mode, args.calls)
                    actor.callgrind.call_one(lib, "stop", f"workload-{mode}").get(timeout=600)
                continue
            client, proc, wall = [], [], []
            for _ in range(args.repeat):
                c0, p0, t0 = cpu_s(os.getpid()), cpu_s(proc_pid), time.perf_counter()
                workload(actor, mode, args.calls)
                wall.append(time.perf_counter() - t0)
                client.append(cpu_s(os.getpid()) - c0)
                proc.append(cpu_s(proc_pid) - p0)
            out[mode] = {"client_cpu_us": statistics.median(client) / args.calls * 1e6,
                         "proc_cpu_us": statistics.median(proc) / args.calls * 1e6,
                         "rate_per_s": args.calls / statistics.median(wall)}
        out["proc_pid"] = proc_pid
    finally:
        procs.stop().get(timeout=600)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5, help="CPU-time runs per workload (the median is kept)")
    ap.add_argument("--modes", default="outstanding,roundtrip")
    ap.add_argument("--callgrind", choices=["client", "proc"], default=None)
    ap.add_argument("--no-torch", action="store_true", help="do not import torch first")
    ap.add_argument("--keep", default="", help="with --callgrind: keep the output files in this folder")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    os.environ.setdefault("MONARCH_SHARED_AGENT", "0")
    if REPO not in sys.path:
        sys.path.insert(0, REPO)

    if args.callgrind and not os.environ.get(_VG_ENV):
        # Again, under valgrind (client) or with a valgrind wrapper for the agent (proc).
        d = args.keep or tempfile.mkdtemp(prefix="hotpath_cg_")
        os.makedirs(d, exist_ok=True)
        build_cg_lib(d)
        # An agent (or a client) under valgrind starts ~50x slower than without.
        env = {**os.environ, _VG_ENV: d, "PYTHONPATH": REPO, "HYPERACTOR_HOST_SPAWN_READY_TIMEOUT": "600s"}
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
        if args.callgrind == "client":
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={d}/client.%p", *cmd]
        try:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=3000)
            if p.returncode != 0:
                print(f"hotpath_cost: the run under valgrind exited {p.returncode}", file=sys.stderr)
                return 1
            out = json.loads(p.stdout.strip().splitlines()[-1])
            dumps = [(f, *cg_dump(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.startswith(args.callgrind + ".")]
            for mode in args.modes:
                mine = [(f, n) for f, why, n in dumps if why.endswith(f"workload-{mode}")]
                if mine:
                    out[mode] = {f"{args.callgrind}_instructions_per_call": float(sum(n for _, n in mine) / args.calls),
                                 "files": [f for f, _ in mine]}
        finally:
            if not args.keep:
                shutil.rmtree(d, ignore_errors=True)
    else:
        out = run(args)
        if os.environ.get(_VG_ENV):
            print(json.dumps(out), flush=True)
            os._exit(0)
    if args.json:
        print(json.dumps(out), flush=True)
    else:
        print(f"load {out['load']:.2f}, {out['calls']} calls per run")
        for mode in args.modes:
            r = out.get(mode, {})
            print(f"  {mode:12s} " + ", ".join(f"{k} {v:,.1f}" for k, v in r.items() if isinstance(v, float)))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
