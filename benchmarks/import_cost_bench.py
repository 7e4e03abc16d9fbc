"""What importing a module costs a fresh interpreter, in CPU time: why monarch's processes use threads.

    python benchmarks/import_cost_bench.py [MODULE ...]     # default: threading asyncio monarch.actor

CPU time (user + sys, from getrusage of the children) of ``python -c 'import M'`` minus that of
``python -c pass``, median of N runs: unlike ``-X importtime``'s wall clock, it holds still on a
loaded machine. The load average is printed beside the figures.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys


def cpu_ms(code: str, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", code], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
    return out


def main() -> None:
    modules = sys.argv[1:] or ["threading", "asyncio", "monarch.actor"]
    runs = int(os.environ.get("RUNS", "21"))
    base = statistics.median(cpu_ms("pass", runs))
    print(f"bare interpreter: {base:.1f} ms CPU (median of {runs}); load average {os.getloadavg()[0]:.1f}")
    for mod in modules:
        med = statistics.median(cpu_ms(f"import {mod}", runs))
        print(f"import {mod}: +{med - base:.1f} ms CPU")


if __name__ == "__main__":
    main()
