#!/usr/bin/env python
"""How monarch's commands grow with the host count, in one run: a table with the ratio to 2 hosts.

    .venv/bin/python benchmarks/scale_bench.py [--hosts 2,8,32,128,256] [--repeat 5] [--json] [--netns]

For each size, a fresh local reservation (``monarch serve --hosts N``, one host agent per
host, in a temp folder), then, each as a user types it (one CLI process each):

* ``serve``: until every agent is ready;
* ``run``: ``monarch run -- true``, p50 over ``--repeat``;
* ``fail``: ``monarch run`` of a command that exits 3 on the last rank and sleeps on the others:
  wall time until the command returns, that is until every rank has stopped;
* ``status``: ``monarch status``;
* ``query``: a GROUP BY over every host's ``run_ranks`` rows (first, then p50 of the next ones);
* ``sync``: ``monarch sync`` of a one-file edit (after a first sync of a small workspace);
  for both, the CPU time of the command's process beside (p50: with the warm runner, the thin client's);
* ``stop``: ``monarch stop``.

``--direct`` also takes ``run -- true``, ``status`` and the query straight from the client
(``MONARCH_FANOUT_DEGREE=0``: no tree of host agents), alternated with the tree's, with the client
process's CPU time beside each.

The agents' footprint is read from /proc: each host's RSS, PSS and private (dirty) memory
(its agent, the agent's zygote, and the zygote's workspace mount process), when idle after serve
and again after the commands above (a query, a workspace mounted), and their CPU use over
``--idle-s`` seconds of idling (percent of one core, per host).  At the first size it also spawns one proc per host (``--procs``) and reads
a proc agent's memory the same way.

Every figure is printed with the 1-minute load average at the time it was taken: on a shared
machine the wall times move with it.  ``--netns`` (root) serves the hosts in network namespaces,
so every message goes over TCP.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "monarch")
MONARCH = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "monarch_cli.main"]

QUERY = "SELECT host, count(*) AS n, min(exit_code) AS lo, max(exit_code) AS hi FROM run_ranks GROUP BY host"
FIGURES = ("serve", "run", "fail", "status", "query_first", "query", "sync", "stop")
#: The goals of issue #28 at 256 hosts (seconds; run: a multiple of its 2-host time).
GOALS = {"serve": 10.0, "query": 0.5, "stop": 3.0, "sync": 0.5}


#: The most hosts a --netns reservation holds (one /24, addresses from .11).
_NETNS_MAX = 243


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class Bench:
    def __init__(self, workdir: str, netns: bool, verbose: bool):
        self.workdir = workdir
        self.netns = netns
        self.verbose = verbose
        # Bytecode written as an installed package has it: with PYTHONDONTWRITEBYTECODE (set in some
        # sandboxes) every command, agent and launcher compiled each file changed since, ~0.1 s each.
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env.update(PYTHONPATH=ROOT, NO_COLOR="1")

    def cli(self, *args: str, ok: tuple[int, ...] = (0,), timeout: float = 900, env: dict | None = None) -> float:
        """Run ``monarch ARGS`` in the workdir; its wall time (its CPU time in ``last_cpu``)."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        p = subprocess.run([*MONARCH, *args], cwd=self.workdir, env={**self.env, **(env or {})}, capture_output=True,
                           text=True, timeout=timeout)
        took = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.last_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if p.returncode not in ok:
            raise RuntimeError(f"monarch {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
        if self.verbose:
            print(f"  monarch {' '.join(args)[:60]}: {took:.3f} s (load {_load()})", file=sys.stderr)
        return took


def _agents(workdir: str) -> list[int]:
    """The host agents' pids, from the reservation's state."""
    sys.path.insert(0, ROOT)
    from monarch._workbench.state import load_state

    rec = load_state(os.path.join(workdir, ".monarch", "job_state.pkl"))
    return [h.pid for h in rec.hosts]


def _mem(pid: int) -> dict[str, int]:
    """kB of Rss, Pss and Private_Dirty of one process (0s when it is gone)."""
    out = {"rss": 0, "pss": 0, "private": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                name = {"Rss": "rss", "Pss": "pss", "Private_Dirty": "private"}.get(key)
                if name:
                    out[name] = int(rest.split()[0])
    except OSError:
        pass
    return out


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (a host: its agent, the zygote, the zygote's workspace mount)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def footprint(agents: list[int], idle_s: float) -> dict:
    """Per host (agent, its zygote and the zygote's helpers such as the workspace mount; MiB): mean
    RSS / PSS / private memory, the agent's own PSS and threads; idle CPU (% of a core)."""
    per_host = []
    for pid in agents:
        procs = _tree(pid)
        mems = [_mem(p) for p in procs]
        per_host.append({k: sum(m[k] for m in mems) / 1024 for k in ("rss", "pss", "private")}
                        | {"agent_rss": mems[0]["rss"] / 1024, "agent_pss": mems[0]["pss"] / 1024,
                           "processes": len(procs), "agent_threads": _threads(pid)})
    before = {p: _cpu_s(p) for a in agents for p in _tree(a)}
    time.sleep(idle_s)
    cpu = sum(_cpu_s(p) - c for p, c in before.items())
    n = max(1, len(agents))
    out = {k: round(statistics.mean(h[k] for h in per_host), 1)
           for k in ("rss", "pss", "private", "agent_rss", "agent_pss", "agent_threads")}
    out["processes_per_host"] = round(statistics.mean(h["processes"] for h in per_host), 2)
    out["total_pss_mib"] = round(sum(h["pss"] for h in per_host), 1)
    out["idle_cpu_pct_per_host"] = round(100 * cpu / idle_s / n, 3)
    out["load"] = _load()
    return out


def proc_footprint(b: Bench, n_hosts: int) -> dict:
    """Spawn one proc per host from a client program, read a proc agent's memory, then let it go."""
    prog = os.path.join(b.workdir, "procs_probe.py")
    with open(prog, "w") as f:
        f.write(
            "import os, sys\n"
            "from monarch._workbench.reserve import load_live\n"
            "from monarch.job.job import host_mesh_of\n"
            "from monarch.actor import Actor, endpoint\n"
            "class Idle(Actor):\n"
            "    @endpoint\n"
            "    def pid(self) -> int:\n"
            "        return os.getpid()\n"
            "rec, _ = load_live()\n"
            "procs = host_mesh_of(rec).spawn_procs(per_host={'gpus': 1})\n"
            "pids = procs.spawn('idle', Idle).pid.call().get(timeout=120)\n"
            "print(' '.join(str(p) for _, p in pids.items()), flush=True)\n"
            "sys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, prog], cwd=b.workdir, env=b.env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        pids = [int(x) for x in line.split()]
        if not pids:
            raise RuntimeError(f"proc probe failed: {p.stderr.read()[-2000:]}")
        time.sleep(1.0)
        mems = [_mem(pid) for pid in pids]
        before = {pid: _cpu_s(pid) for pid in pids}
        time.sleep(3.0)
        cpu = sum(_cpu_s(pid) - c for pid, c in before.items())
        out = {k: round(statistics.mean(m[k] for m in mems) / 1024, 1) for k in ("rss", "pss", "private")}
        out["idle_cpu_pct_per_proc"] = round(100 * cpu / 3.0 / len(pids), 3)
        out["load"] = _load()
        return out
    finally:
        try:
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


#: The client's environment for the direct path (every message from the client, no tree of agents).
DIRECT = {"MONARCH_FANOUT_DEGREE": "0"}


def tree_vs_direct(b: Bench, repeat: int) -> dict:
    """``run -- true``, ``status`` and the query, through the tree and straight from the client,
    alternated (the load drifts less between the two): p50 wall and the client's CPU seconds."""
    out: dict = {}
    for name, args in (("run", ("run", "--", "true")), ("status", ("status",)), ("query", ("query", QUERY))):
        walls: dict[str, list] = {"tree": [], "direct": []}
        cpus: dict[str, list] = {"tree": [], "direct": []}
        for _ in range(repeat):
            for how, env in (("tree", {}), ("direct", DIRECT)):
                walls[how].append(b.cli(*args, env=env))
                cpus[how].append(b.last_cpu)
        for how in ("tree", "direct"):
            out[f"{name}_{how}"] = round(statistics.median(walls[how]), 4)
            out[f"{name}_{how}_cpu"] = round(statistics.median(cpus[how]), 4)
    out["load"] = _load()
    return out


def bench_size(n: int, repeat: int, idle_s: float, netns: bool, procs: bool, verbose: bool,
               direct: bool = False) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"scale{n}-")
    b = Bench(workdir, netns, verbose)
    ws = os.path.join(workdir, "ws")
    os.makedirs(ws)
    for i in range(20):
        with open(os.path.join(ws, f"f{i}.py"), "w") as f:
            f.write(f"x = {i}\n" * 50)
    res: dict = {"hosts": n, "load": {}}
    served = False
    try:
        serve_args = ["serve", "--hosts", str(n), "--timeout", "600"] + (["--netns"] if netns else [])
        res["serve"] = b.cli(*serve_args)
        served = True
        res["load"]["serve"] = _load()
        res["footprint_idle"] = footprint(_agents(workdir), idle_s)
        if direct:
            res["tree_vs_direct"] = tree_vs_direct(b, repeat)
        runs = [b.cli("run", "--", "true") for _ in range(repeat)]
        res["run"] = statistics.median(runs)
        res["load"]["run"] = _load()
        last = n - 1
        cmd = f'[ "$NODE_RANK" = "{last}" ] && exit 3; exec sleep 120'
        res["fail"] = b.cli("run", "--", "sh", "-c", cmd, ok=(3,))
        res["load"]["fail"] = _load()
        res["status"] = b.cli("status")
        res["load"]["status"] = _load()
        res["query_first"] = b.cli("query", QUERY)
        walls, cpus = [], []
        for _ in range(repeat):
            walls.append(b.cli("query", QUERY))
            cpus.append(b.last_cpu)
        res["query"] = statistics.median(walls)
        res["client_cpu"] = {"query": round(statistics.median(cpus), 4)}
        res["load"]["query"] = _load()
        try:
            res["sync_first"] = b.cli("sync", "--workspace", ws)
            edits, cpus = [], []
            for i in range(repeat):
                with open(os.path.join(ws, "f0.py"), "a") as f:
                    f.write(f"y = {i}\n")
                edits.append(b.cli("sync"))
                cpus.append(b.last_cpu)
            res["sync"] = statistics.median(edits)
            res["client_cpu"]["sync"] = round(statistics.median(cpus), 4)
        except RuntimeError as e:  # a figure that could not be taken is reported; the others still are
            res.setdefault("errors", {})["sync"] = str(e)[-500:]
        res["load"]["sync"] = _load()
        res["footprint_used"] = footprint(_agents(workdir), idle_s)
        if procs:
            res["proc_footprint"] = proc_footprint(b, n)
        res["stop"] = b.cli("stop")
        served = False
        res["load"]["stop"] = _load()
    finally:
        if served:
            subprocess.run([*MONARCH, "stop"], cwd=workdir, env=b.env, capture_output=True, timeout=300)
        shutil.rmtree(workdir, ignore_errors=True)
    return res


def table(results: list[dict]) -> str:
    base = results[0]
    head = f"{'hosts':>6} " + " ".join(f"{f:>17}" for f in FIGURES) + f" {'agent MiB':>22} {'idle CPU':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        cells = []
        for f in FIGURES:
            if f not in r:
                cells.append(f"{'-':>17}")
                continue
            ratio = r[f] / base[f] if base.get(f) else 0
            load = r["load"].get(f.replace("_first", ""), 0.0)
            cells.append(f"{r[f]:6.3f}s x{ratio:4.1f} L{load:.1f}".rjust(17))
        fp = r.get("footprint_used") or r.get("footprint_idle") or {}
        idle = r.get("footprint_idle") or {}
        mem = f"{idle.get('pss', 0):.0f}/{fp.get('pss', 0):.0f} pss {fp.get('rss', 0):.0f} rss"
        lines.append(f"{r['hosts']:>6} " + " ".join(cells) + f" {mem:>22} {idle.get('idle_cpu_pct_per_host', 0):8.2f}%")
    for r in results:
        for what, why in (r.get("errors") or {}).items():
            lines.append(f"{r['hosts']} hosts: no {what} figure: {why}")
    lines.append("cells: seconds, ratio to the first size, 1-min load average then. agent MiB: PSS per host (agent,"
                 " zygote, workspace mount) idle after serve / after the commands, and RSS after. idle CPU: % of one"
                 " core per host.")
    last = results[-1]
    if last["hosts"] >= 256:
        verdict = [f"{k} {last[k]:.2f}s {'ok' if last[k] <= g else 'over'} (goal {g:g}s)" for k, g in GOALS.items()
                   if k in last]
        if "run" in last and base.get("run"):
            verdict.append(f"run x{last['run'] / base['run']:.1f} {'ok' if last['run'] <= 2 * base['run'] else 'over'} (goal x2)")
        lines.append("goals at 256 hosts: " + "; ".join(verdict))
    for r in results:
        cpu = r.get("client_cpu") or {}
        if cpu:
            lines.append(f"{r['hosts']} hosts, CPU of the command's process (p50; a command the warm runner takes"
                         " runs in the runner's child, not counted here): " + ", ".join(f"{k} {v:.3f}s" for k, v in cpu.items()))
    for r in results:
        c = r.get("tree_vs_direct")
        if c:
            lines.append(f"{r['hosts']} hosts, through the tree / straight from the client (p50 wall, client CPU; "
                         f"load {c['load']}): " + "; ".join(
                             f"{k} {c[k + '_tree']:.3f}s/{c[k + '_direct']:.3f}s cpu {c[k + '_tree_cpu']:.3f}/"
                             f"{c[k + '_direct_cpu']:.3f}s" for k in ("run", "status", "query")))
        idle, used = r.get("footprint_idle") or {}, r.get("footprint_used") or {}
        if idle:
            lines.append(f"footprint at {r['hosts']} hosts, per host: idle {idle['pss']} MiB PSS ({idle['private']} private;"
                         f" agent alone {idle.get('agent_pss', 0)} PSS, {idle.get('agent_threads', 0):g} threads),"
                         f" after the commands {used.get('pss', 0)} MiB PSS ({used.get('private', 0)} private,"
                         f" {used.get('processes_per_host', 0):g} processes); all hosts {used.get('total_pss_mib', 0):.0f}"
                         f" MiB PSS; idle CPU {idle['idle_cpu_pct_per_host']}% of a core (load {idle['load']})")
    for r in results:
        if "proc_footprint" in r:
            p = r["proc_footprint"]
            lines.append(f"proc agent (at {r['hosts']} hosts): rss {p['rss']} MiB, pss {p['pss']} MiB, private "
                         f"{p['private']} MiB, idle CPU {p['idle_cpu_pct_per_proc']}% (load {p['load']})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="2,8,32,128,256", help="comma-separated sizes (the first is the baseline)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--idle-s", type=float, default=3.0, help="seconds of idling to measure the agents' CPU over")
    ap.add_argument("--netns", action="store_true", help="hosts in network namespaces (root): every message over TCP")
    ap.add_argument("--no-procs", action="store_true", help="skip the proc agent's footprint")
    ap.add_argument("--direct", action="store_true",
                    help="also run, status and query straight from the client (MONARCH_FANOUT_DEGREE=0), alternated")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true", help="each command's time on stderr as it is taken")
    a = ap.parse_args()
    sizes = [int(x) for x in a.hosts.split(",") if x.strip()]
    if a.netns and any(n > _NETNS_MAX for n in sizes):
        # A --netns reservation's hosts share one /24 (monarch_schedulers/netns.py).
        print(f"--netns: at most {_NETNS_MAX} hosts; left out: {[n for n in sizes if n > _NETNS_MAX]}", file=sys.stderr)
        sizes = [n for n in sizes if n <= _NETNS_MAX]
    # Each file compiled once now, as an install does, not by the first command of the first size.
    subprocess.run([sys.executable, "-m", "compileall", "-q",
                    *(os.path.join(ROOT, d) for d in ("monarch", "monarch_agents", "monarch_cli", "monarch_rdmafs",
                                                      "monarch_schedulers", "monarch_telemetry"))],
                   capture_output=True, env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    results = []
    for i, n in enumerate(sizes):
        print(f"{n} hosts (load {_load()}) …", file=sys.stderr, flush=True)
        results.append(bench_size(n, a.repeat, a.idle_s, a.netns, procs=(i == 0 and not a.no_procs),
                                  verbose=a.verbose, direct=a.direct))
        # Each size as it ends: a run cut short keeps what it measured.
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps({"sizes": results, "netns": a.netns}, indent=1))
    else:
        print(table(results))


if __name__ == "__main__":
    main()
