"""How fast `monarch run` prints a rank's output, in one run, against `cat` of the same bytes.

    .venv/bin/python benchmarks/print_bench.py [--mb 40] [--n 3] [--json]

Serves a 1-host local reservation in a temp dir, writes two files of ``--mb`` MB each there, and
times (median of ``--n``), with stdout to a pipe that is read to the end:

* one line: ``--mb`` MB without a newline (the client's printer was quadratic on it: 10/20/40 MB
  took 0.6/2.1/8.2 s), through ``monarch run -- cat FILE``;
* short lines: the same size in 1,000-char lines, through ``monarch run -- cat FILE``;
* the baseline of each: ``cat FILE`` here, and a ``monarch run -- true`` (a run's fixed cost).

Prints seconds and the ratios ``monarch run`` / ``cat`` (and the same less the fixed cost), so the
printer's cost per byte shows apart from a run's start.
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
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "monarch")
MONARCH = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "monarch_cli.main"]


def timed(argv: list[str], cwd: str, env: dict, expect: int) -> float:
    """Seconds until ``argv`` exits, its stdout read to the end (and checked to be ``expect`` bytes or more)."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    n = 0
    while True:
        chunk = p.stdout.read1(1 << 20)
        if not chunk:
            break
        n += len(chunk)
    err = p.stderr.read()
    code = p.wait()
    took = time.perf_counter() - t
    if code != 0 or n < expect:
        raise SystemExit(f"{' '.join(argv)}: exit {code}, {n} bytes of {expect}\n{err.decode(errors='replace')[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=40, help="size of each file, MB")
    ap.add_argument("--n", type=int, default=3, help="repetitions (the median is reported)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    size = args.mb * 1_000_000
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    with tempfile.TemporaryDirectory(prefix="print-bench-") as d:
        one = os.path.join(d, "one-line.txt")
        with open(one, "wb") as f:
            f.write(b"x" * size)
        short = os.path.join(d, "short-lines.txt")
        with open(short, "wb") as f:
            f.write((b"y" * 999 + b"\n") * (size // 1000))
        subprocess.run([*MONARCH, "serve", "--hosts", "1"], cwd=d, env=env, check=True, capture_output=True, timeout=120)
        try:
            times: dict[str, list[float]] = {k: [] for k in ("fixed", "one_line", "short_lines", "cat_one", "cat_short")}
            for _ in range(args.n):  # interleaved, so that load changes hit each alike
                times["fixed"].append(timed([*MONARCH, "run", "--", "true"], d, env, 0))
                times["one_line"].append(timed([*MONARCH, "run", "--", "cat", one], d, env, size))
                times["cat_one"].append(timed(["cat", one], d, env, size))
                times["short_lines"].append(timed([*MONARCH, "run", "--", "cat", short], d, env, size))
                times["cat_short"].append(timed(["cat", short], d, env, size))
        finally:
            subprocess.run([*MONARCH, "stop"], cwd=d, env=env, capture_output=True, timeout=120)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "mb": args.mb, "n": args.n, "load_1m": os.getloadavg()[0],
        **{f"{k}_s": round(v, 4) for k, v in med.items()},
        "one_line_vs_cat": med["one_line"] / med["cat_one"],
        "short_lines_vs_cat": med["short_lines"] / med["cat_short"],
        "one_line_less_fixed_s": round(med["one_line"] - med["fixed"], 4),
        "short_lines_less_fixed_s": round(med["short_lines"] - med["fixed"], 4),
        "one_line_vs_short_lines": med["one_line"] / med["short_lines"],
    }
    if args.json:
        print(json.dumps(res))
        return
    print(f"{args.mb} MB through `monarch run -- cat` vs `cat`, median of {args.n}, load {res['load_1m']:.1f}")
    print(f"  a run's fixed cost (`monarch run -- true`): {med['fixed']:.2f} s")
    print(f"  one {args.mb} MB line:       {med['one_line']:.2f} s  vs cat {med['cat_one']:.3f} s  "
          f"({res['one_line_vs_cat']:.0f}x; {res['one_line_less_fixed_s']:.2f} s beyond a run's fixed cost)")
    print(f"  {size // 1000:,} 1,000-char lines: {med['short_lines']:.2f} s  vs cat {med['cat_short']:.3f} s  "
          f"({res['short_lines_vs_cat']:.0f}x; {res['short_lines_less_fixed_s']:.2f} s beyond a run's fixed cost)")
    print(f"  one line / short lines: {res['one_line_vs_short_lines']:.2f} (1.0: linear, whatever the line length)")


if __name__ == "__main__":
    sys.exit(main())
