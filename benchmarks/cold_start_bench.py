#!/usr/bin/env python
"""Cold start: ``python prog.py`` to its first actor reply, ours beside torchmonarch, interleaved.

    .venv/bin/python benchmarks/cold_start_bench.py                 # 7 rounds, table + timeline
    .venv/bin/python benchmarks/cold_start_bench.py --reps 2 --json # smoke

Each round runs, one after another (so they see the same load), the same program under:

* ``torchmonarch``: PyTorch Monarch 0.7.0 (``--torchmonarch-python``; skipped when missing);
* ``monarch, own agent``: ours with ``MONARCH_SHARED_AGENT=0``: the script starts a private host
  agent, as every script did before the shared agent (and as a first script still does);
* ``monarch, shared agent``: ours with the user's shared host agent already warm (started by
  the round before; see ``monarch_agents.local_agent``).

Per run: wall time from launch to the first reply, the CPU time that took (the script's and
its waited children's, from ``getrusage``; for the shared agent, the agent's and its procs'
growth too), and the timeline of the first call: interpreter start, ``import monarch.actor``,
``this_host()``, ``spawn_procs``, ``spawn``, first reply.  Medians are printed with the load
average at the start and end of the run, as the machine is shared.  ``python -c pass`` is
measured beside them as the floor.  The shared agent runs in a private runtime folder of this
benchmark and is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
#: torchmonarch's interpreter: $TORCHMONARCH_PYTHON, else a .tm-venv at the root (as tests/compat look).
DEFAULT_TM_PYTHON = os.environ.get("TORCHMONARCH_PYTHON") or os.path.join(REPO, ".tm-venv", "bin", "python")

PROG = r"""
import time
T = [("start", time.time())]
from monarch.actor import Actor, endpoint, this_host
T.append(("import", time.time()))
class Pinger(Actor):
    @endpoint
    def ping(self):
        return 42
host = this_host()
T.append(("this_host", time.time()))
procs = host.spawn_procs(per_host={"gpus": 1})
T.append(("spawn_procs", time.time()))
actor = procs.spawn("pinger", Pinger)
T.append(("spawn", time.time()))
assert actor.ping.call_one().get(timeout=120) == 42
T.append(("first_reply", time.time()))
print("TIMELINE " + " ".join(f"{k}={v!r}" for k, v in T), flush=True)
procs.stop().get(timeout=30)
"""

PHASES = ["start", "import", "this_host", "spawn_procs", "spawn", "first_reply"]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a process, its live descendants, and the children they reaped."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def _agent_pids(rt_dir: str) -> list[int]:
    import psutil

    found = {}
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "--shared-socket" in cmd and cmd[cmd.index("--shared-socket") + 1].startswith(rt_dir):
            found[p.pid] = p.info["ppid"]
    # The agents, not their zygotes (forks of them, with the same command line).
    return [pid for pid, ppid in found.items() if ppid not in found]


def run_once(python: str, env: dict, cwd: str, agent_of: str | None = None) -> dict:
    agent_cpu0 = sum(_tree_cpu(p) for p in _agent_pids(agent_of)) if agent_of else 0.0
    cpu0 = _children_cpu()
    t0 = time.time()
    p = subprocess.run([python, "-c", PROG], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    total = time.time() - t0
    cpu = _children_cpu() - cpu0
    if agent_of:
        cpu += sum(_tree_cpu(p) for p in _agent_pids(agent_of)) - agent_cpu0
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("TIMELINE ")]
    if p.returncode != 0 or not line:
        raise RuntimeError(f"{python}: exit {p.returncode}: {(p.stderr or p.stdout)[-800:]}")
    stamps = dict(kv.split("=") for kv in line[0].split()[1:])
    marks = {"launch": 0.0, **{k: float(v) - t0 for k, v in stamps.items()}}
    return {"first_reply_s": marks["first_reply"], "exit_s": total, "cpu_s": cpu, "marks": marks}


def python_floor(python: str) -> dict:
    cpu0 = _children_cpu()
    t0 = time.time()
    subprocess.run([python, "-c", "pass"], check=True)
    return {"first_reply_s": time.time() - t0, "cpu_s": _children_cpu() - cpu0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--torchmonarch-python", default=DEFAULT_TM_PYTHON)
    ap.add_argument("--json", action="store_true", help="JSON on stdout (the table goes to stderr)")
    args = ap.parse_args(argv)
    # Byte-compiled as an install leaves it: with PYTHONDONTWRITEBYTECODE set (this machine's shells
    # have it), a source edited since would be compiled again by every timed start.
    import compileall

    for pkg in ("monarch_agents", "monarch", "monarch_cli", "monarch_schedulers", "monarch_telemetry", "monarch_rdmafs"):
        compileall.compile_dir(os.path.join(REPO, pkg), quiet=1)

    work = tempfile.mkdtemp(prefix="coldb-")
    rt_dir = os.path.join(work, "rt")
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MONARCH_SHARED_AGENT")}
    ours_env = {**base, "PYTHONPATH": REPO}
    variants: dict[str, tuple[str, dict, str, str | None]] = {
        "python -c pass": (sys.executable, {}, work, None),
        "monarch, own agent": (sys.executable, {**ours_env, "MONARCH_SHARED_AGENT": "0"}, work, None),
        "monarch, shared agent": (sys.executable, {**ours_env, "MONARCH_SHARED_AGENT": "1",
                                                   "MONARCH_RUNTIME_DIR": rt_dir}, work, rt_dir),
    }
    tm = args.torchmonarch_python
    if tm and os.path.exists(tm):
        variants["torchmonarch"] = (tm, dict(base), work, None)  # cwd outside this repo: its own monarch
    runs: dict[str, list[dict]] = {k: [] for k in variants}
    load_start = os.getloadavg()
    try:
        # Warm the shared agent (and the page cache for everyone) once, unmeasured.
        run_once(*variants["monarch, shared agent"])
        for _ in range(args.reps):
            for name, (python, env, cwd, agent_of) in variants.items():
                runs[name].append(python_floor(python) if name == "python -c pass" else
                                  run_once(python, env, cwd, agent_of))
    finally:
        for pid in _agent_pids(rt_dir):
            os.kill(pid, signal.SIGTERM)
        shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()

    summary: dict = {"reps": args.reps, "load_start": load_start, "load_end": load_end, "variants": {}}
    for name, rs in runs.items():
        s = {"first_reply_ms": statistics.median(r["first_reply_s"] for r in rs) * 1e3,
             "cpu_ms": statistics.median(r["cpu_s"] for r in rs) * 1e3}
        if rs and "marks" in rs[0]:
            s["timeline_ms"] = {k: statistics.median(r["marks"][k] for r in rs) * 1e3 for k in ["launch", *PHASES]}
        summary["variants"][name] = s
    tm_ms = summary["variants"].get("torchmonarch", {}).get("first_reply_ms")
    tm_cpu = summary["variants"].get("torchmonarch", {}).get("cpu_ms")
    lines = [f"cold start, python prog.py to the first actor reply: median of {args.reps} interleaved rounds; "
             f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end ({os.cpu_count()} cpus)", ""]
    lines.append(f"{'':24} {'wall ms':>9} {'vs tm':>7} {'cpu ms':>8} {'vs tm':>7}")
    for name, s in summary["variants"].items():
        r = f"{s['first_reply_ms'] / tm_ms:.2f}x" if tm_ms else ""
        rc = f"{s['cpu_ms'] / tm_cpu:.2f}x" if tm_cpu else ""
        lines.append(f"{name:24} {s['first_reply_ms']:9.1f} {r:>7} {s['cpu_ms']:8.1f} {rc:>7}")
    lines += ["", "timeline of the first call (ms since launch; medians):",
              f"{'':24} " + " ".join(f"{k:>12}" for k in PHASES)]
    for name, s in summary["variants"].items():
        if "timeline_ms" in s:
            lines.append(f"{name:24} " + " ".join(f"{s['timeline_ms'][k]:12.1f}" for k in PHASES))
    lines.append("start = the program's first line runs (interpreter started); each column is when that step "
                 "returned.  cpu = the script's CPU time and its children's (for the shared agent, what the "
                 "agent and its procs used meanwhile too).")
    table = "\n".join(lines)
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps(summary, indent=2))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
