"""`monarch serve` and a warm `monarch run` on Slurm, against plain salloc/srun, in one run.

    .venv/bin/python benchmarks/slurm_bench.py [--serves 5] [--runs 15] [--hosts 4] [--json] [--quick]

Uses the cluster SLURM_CONF points at when it answers; otherwise starts the local 4-node
cluster (scripts/slurm_cluster.sh, needs root) in a temporary directory on free ports and
stops it at the end.  Times, as wall clock around the commands a user types (p50/p90):

* serve -> ready: `monarch serve --scheduler slurm --hosts N` until it returns, i.e. until
  every host agent has reported its address; then `monarch stop` (timed too).
  Baselines: `salloc -N N srun hostname` and `salloc -N N srun python -c pass` (allocate,
  start one process per node, release: Slurm's fastest path), and `sbatch -N N --wrap 'srun
  python ...'` until every node's process has printed (the batch path serve takes, because
  its agents must outlive the command; the output file is watched every 5 ms).
* warm run: `monarch run -- hostname` and `monarch run -- python -c pass` on the N served
  nodes.  Baselines: `srun -N N hostname` / `srun -N N python -c pass` inside one existing
  allocation (`salloc --no-shell`).

Prints each p50 and the ratios monarch / baseline.  Nothing else should use the cluster
meanwhile: the measurements share its nodes and this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MONARCH = [sys.executable, "-m", "monarch_cli.main"]
CLUSTER_SCRIPT = os.path.join(ROOT, "scripts", "slurm_cluster.sh")
_CMD_TIMEOUT_S = 120


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}


def _run(cmd: list[str], cwd: str, what: str) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise SystemExit(f"slurm_bench: {what} failed (exit {r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r


def _timed(cmd: list[str], cwd: str, what: str) -> float:
    t = time.perf_counter()
    _run(cmd, cwd, what)
    return time.perf_counter() - t


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"p50_ms": round(statistics.median(xs) * 1000, 1), "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 1),
            "n": len(xs)}


# -- the cluster ------------------------------------------------------------------------------


def _cluster_answers() -> bool:
    if not os.environ.get("SLURM_CONF") or shutil.which("sinfo") is None:
        return False
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0 and r.stdout.strip() != ""


def _free_port_block(count: int) -> int:
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SystemExit("slurm_bench: no free ports for a cluster")


class PrivateCluster:
    """The local 4-node cluster in a temporary directory, for as long as the benchmark runs."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="monarch-slurm-bench-")
        self.env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
        self.env["MONARCH_SLURMCTLD_PORT"] = str(_free_port_block(1))
        self.env["MONARCH_SLURMD_PORT"] = str(_free_port_block(1))
        self.env["MONARCH_SLURM_NODE_PORT"] = str(_free_port_block(4))

    def __enter__(self) -> "PrivateCluster":
        if os.geteuid() != 0:
            raise SystemExit("slurm_bench: no Slurm cluster answers (SLURM_CONF) and starting one needs root")
        for cmd in (["install"], ["start", self.dir]):
            r = subprocess.run([CLUSTER_SCRIPT, *cmd], env=self.env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                self.__exit__()
                raise SystemExit(f"slurm_bench: slurm_cluster.sh {cmd[0]} failed:\n{r.stderr[-2000:]}")
        os.environ["SLURM_CONF"] = r.stdout.strip().splitlines()[-1].split("=", 1)[1]
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run([CLUSTER_SCRIPT, "stop", self.dir], env=self.env, capture_output=True, timeout=120)
        os.environ.pop("SLURM_CONF", None)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the measurements -------------------------------------------------------------------------


def sbatch_until_every_node_ran(work: str, hosts: int) -> float:
    """Seconds from ``sbatch`` to one Python process having run on every node (what serve waits
    for, through Slurm's batch path), watching the job's output file; waits for the job to leave."""
    out = os.path.join(work, f"sbatch-{time.monotonic_ns()}.out")
    code = "import socket; print(socket.gethostname(), flush=True)"
    t = time.perf_counter()
    r = _run(["sbatch", "--parsable", f"-N{hosts}", "--ntasks-per-node=1", "--time=10:00", f"--output={out}",
              "--wrap", f"srun {sys.executable} -c '{code}'"], work, "sbatch")
    job_id = r.stdout.strip().split(";")[0]
    deadline = time.monotonic() + _CMD_TIMEOUT_S
    while True:
        try:
            with open(out) as f:
                if len(f.read().splitlines()) >= hosts:
                    break
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"slurm_bench: sbatch job {job_id} did not run on {hosts} nodes")
        time.sleep(0.005)
    took = time.perf_counter() - t
    _wait_left_queue(job_id)
    return took


def _wait_left_queue(job_id: str) -> None:
    """Until the job is out of squeue (its nodes free for the next measurement)."""
    deadline = time.monotonic() + _CMD_TIMEOUT_S
    while time.monotonic() < deadline:
        r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0 or not r.stdout.strip():
            return
        time.sleep(0.02)


def bench_serve(work: str, hosts: int, n: int) -> tuple[dict, dict]:
    """serve -> every agent ready, and stop, ``n`` times each; the salloc/sbatch baselines interleaved."""
    serve = [*MONARCH, "--json", "serve", "--scheduler", "slurm", "--hosts", str(hosts), "--time", "10:00"]
    salloc = ["salloc", f"-N{hosts}", "--time=10:00", "srun"]
    times: dict[str, list[float]] = {"serve": [], "stop": [], "salloc_hostname": [], "salloc_python": [], "sbatch": []}
    # Slurm's first scheduling pass after a start is slower: keep it out of the numbers.
    _run([*salloc, "hostname"], work, "warm-up salloc")
    for _ in range(n):
        times["salloc_hostname"].append(_timed([*salloc, "hostname"], work, "salloc srun hostname"))
        times["salloc_python"].append(_timed([*salloc, sys.executable, "-c", "pass"], work, "salloc srun python"))
        times["sbatch"].append(sbatch_until_every_node_ran(work, hosts))
        t = time.perf_counter()
        r = _run(serve, work, "monarch serve")
        times["serve"].append(time.perf_counter() - t)
        served = json.loads(r.stdout)
        if not served["ready"] or len(served["hosts"]) != hosts or served["reused"]:
            raise SystemExit(f"slurm_bench: serve did not make {hosts} fresh ready hosts: {served}")
        times["stop"].append(_timed([*MONARCH, "stop"], work, "monarch stop"))
    res = {
        f"monarch serve -> {hosts} agents ready": summary(times["serve"]),
        f"salloc -N{hosts} srun hostname": summary(times["salloc_hostname"]),
        f"salloc -N{hosts} srun python -c pass": summary(times["salloc_python"]),
        f"sbatch -N{hosts} srun python, until all ran": summary(times["sbatch"]),
        "monarch stop (scancel, agents gone)": summary(times["stop"]),
    }
    return res, times


def bench_run(work: str, hosts: int, n: int) -> dict:
    """Warm runs on a served reservation vs srun steps in one existing allocation."""
    _run([*MONARCH, "serve", "--scheduler", "slurm", "--hosts", str(hosts), "--time", "10:00"], work, "monarch serve")
    job_id = ""
    try:
        r = _run(["salloc", f"-N{hosts}", "--time=10:00", "--no-shell"], work, "salloc --no-shell")
        job_id = next((w for w in (r.stdout + r.stderr).split() if w.isdigit()), "")
        if not job_id:
            raise SystemExit(f"slurm_bench: salloc printed no job id: {r.stderr}")
        srun = ["srun", f"--jobid={job_id}", f"-N{hosts}", f"--ntasks={hosts}"]
        commands = {
            "hostname": (["hostname"], ["hostname"]),
            "python -c pass": ([sys.executable, "-c", "pass"], [sys.executable, "-c", "pass"]),
        }
        times: dict[str, list[float]] = {}
        for label, (mon_cmd, srun_cmd) in commands.items():
            mon_key, srun_key = f"monarch run -- {label} ({hosts} nodes, warm)", f"srun {label} in salloc ({hosts} nodes)"
            times[mon_key], times[srun_key] = [], []
            _run([*MONARCH, "run", "--", *mon_cmd], work, "warm-up monarch run")
            _run([*srun, *srun_cmd], work, "warm-up srun")
            for _ in range(n):
                times[mon_key].append(_timed([*MONARCH, "run", "--", *mon_cmd], work, "monarch run"))
                times[srun_key].append(_timed([*srun, *srun_cmd], work, "srun"))
        return {k: summary(v) for k, v in times.items()}
    finally:
        if job_id:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
            _wait_left_queue(job_id)
        subprocess.run([*MONARCH, "stop"], cwd=work, env=_env(), capture_output=True, timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serves", type=int, default=5, help="serve/stop rounds (and salloc baselines)")
    ap.add_argument("--runs", type=int, default=15, help="warm runs of each command (and srun baselines)")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="one serve, three runs: checks it works, not how fast")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.serves, a.runs = 1, 3
    cluster = None if _cluster_answers() else PrivateCluster()
    try:
        if cluster is not None:
            cluster.__enter__()
        with tempfile.TemporaryDirectory(prefix="monarch-slurm-bench-work-") as work:
            res, _ = bench_serve(work, a.hosts, a.serves)
            res.update(bench_run(work, a.hosts, a.runs))
    finally:
        if cluster is not None:
            cluster.__exit__()
    h = a.hosts

    def p50(key: str) -> float:
        return res[key]["p50_ms"]

    serve = p50(f"monarch serve -> {h} agents ready")
    ratios = {
        "serve->ready / salloc srun hostname": round(serve / p50(f"salloc -N{h} srun hostname"), 2),
        "serve->ready / salloc srun python -c pass": round(serve / p50(f"salloc -N{h} srun python -c pass"), 2),
        "serve->ready / sbatch srun python": round(serve / p50(f"sbatch -N{h} srun python, until all ran"), 2),
    }
    for label in ("hostname", "python -c pass"):
        mon, base = p50(f"monarch run -- {label} ({h} nodes, warm)"), p50(f"srun {label} in salloc ({h} nodes)")
        ratios[f"monarch run / srun ({label})"] = round(mon / base, 2)
        ratios[f"monarch run - srun ({label}), ms"] = round(mon - base, 1)
    if a.json:
        print(json.dumps({"hosts": h, "results": res, "ratios": ratios}, indent=2))
        return
    width = max(len(k) for k in [*res, *ratios]) + 2
    for k, v in res.items():
        print(f"{k:{width}s} p50 {v['p50_ms']:8.1f} ms   p90 {v['p90_ms']:8.1f} ms   (n={v['n']})")
    for k, v in ratios.items():
        print(f"{k:{width}s} {v}")


if __name__ == "__main__":
    main()
