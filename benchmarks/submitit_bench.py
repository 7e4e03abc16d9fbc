"""submitit with cluster="monarch" on a Slurm reservation, against cluster="slurm" and "local", in one run.

    .venv/bin/python benchmarks/submitit_bench.py [--submits 20] [--array 100] [--hosts 4] [--json] [--quick]

Uses the cluster SLURM_CONF points at when it answers; otherwise starts the local 4-node cluster
(scripts/slurm_cluster.sh, needs root) on free ports and stops it at the end. Times, wall clock:

* ``submit(f).result()`` of a trivial function, one after another (p50 and total):
  cluster="monarch" on a `monarch serve --scheduler slurm --hosts N` reservation, cluster="slurm"
  (one sbatch job each, on the same cluster), cluster="local" (a process on this machine);
* a ``map_array`` of ``--array`` items until every result is in: monarch and local (Slurm's array
  of that size takes minutes on this cluster and is left out unless ``--slurm-array``).

Prints each figure and the ratios baseline / monarch (how many times faster monarch is).
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from slurm_bench import PrivateCluster, _cluster_answers  # noqa: E402  (the same private cluster)

MONARCH = [sys.executable, "-m", "monarch_cli.main"]


def trivial(x: int) -> int:
    return x + 1


def _sequential(executor, n: int) -> dict:
    times = []
    t_all = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        assert executor.submit(trivial, i).result() == i + 1
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - t_all
    return {"p50_ms": round(statistics.median(times) * 1000, 1), "total_s": round(total, 2), "n": n}


def _array(executor, n: int) -> dict:
    t = time.perf_counter()
    jobs = executor.map_array(trivial, range(n))
    assert [j.result() for j in jobs] == [i + 1 for i in range(n)]
    return {"total_s": round(time.perf_counter() - t, 2), "n": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--submits", type=int, default=20)
    ap.add_argument("--array", type=int, default=100)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--slurm-array", action="store_true", help="also time the array on plain Slurm (slow)")
    ap.add_argument("--quick", action="store_true", help="3 submits, a 6-item array: checks it works")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.submits, a.array = 3, 6
    cluster = None if _cluster_answers() else PrivateCluster()
    res: dict[str, dict] = {}
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # submitit and its executors talk on stdout: keep it for the figures
    import submitit  # after the swap: its logger keeps the stream it finds at import

    try:
        if cluster is not None:
            cluster.__enter__()
        with tempfile.TemporaryDirectory(prefix="monarch-submitit-bench-") as work:
            os.chdir(work)
            subprocess.run([*MONARCH, "serve", "--scheduler", "slurm", "--hosts", str(a.hosts)], check=True,
                           capture_output=True, timeout=120)
            try:
                mon = submitit.AutoExecutor(folder=os.path.join(work, "monarch"), cluster="monarch")
                res["monarch submit().result()"] = _sequential(mon, a.submits)
                res["monarch map_array"] = _array(mon, a.array)
            finally:
                subprocess.run([*MONARCH, "stop"], capture_output=True, timeout=120)
            slurm = submitit.AutoExecutor(folder=os.path.join(work, "slurm"), cluster="slurm")
            slurm.update_parameters(slurm_partition="debug", timeout_min=5)
            res["slurm submit().result()"] = _sequential(slurm, a.submits)
            if a.slurm_array:
                res["slurm map_array"] = _array(slurm, a.array)
            local = submitit.AutoExecutor(folder=os.path.join(work, "local"), cluster="local")
            res["local submit().result()"] = _sequential(local, a.submits)
            res["local map_array"] = _array(local, a.array)
    finally:
        if cluster is not None:
            cluster.__exit__()
        sys.stdout = real_stdout
    m = res["monarch submit().result()"]["p50_ms"]
    ratios = {"slurm / monarch (submit-result p50)": round(res["slurm submit().result()"]["p50_ms"] / m, 1),
              "local / monarch (submit-result p50)": round(res["local submit().result()"]["p50_ms"] / m, 1),
              "local / monarch (map_array)": round(res["local map_array"]["total_s"] /
                                                   res["monarch map_array"]["total_s"], 1)}
    if "slurm map_array" in res:
        ratios["slurm / monarch (map_array)"] = round(res["slurm map_array"]["total_s"] /
                                                      res["monarch map_array"]["total_s"], 1)
    if a.json:
        print(json.dumps({"hosts": a.hosts, "results": res, "ratios": ratios}, indent=2))
        return
    width = max(len(k) for k in [*res, *ratios]) + 2
    for k, v in res.items():
        print(f"{k:{width}s} " + "  ".join(f"{kk} {vv}" for kk, vv in v.items()))
    for k, v in ratios.items():
        print(f"{k:{width}s} {v}x")


if __name__ == "__main__":
    main()
