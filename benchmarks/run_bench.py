"""`monarch run` overhead, in one run: monarch vs the bare command vs torchrun cold start.

    .venv/bin/python benchmarks/run_bench.py [--n 15] [--json] [--baseline GIT-REF] [--netns]

Also the CPU time each command used itself (user + system, from wait4): little moved by
other load, it compares a before/after on a busy machine where wall times drown in noise.
With --baseline, the `monarch` of that commit (its tree unpacked from git into a temp folder)
is timed in the same rounds as this one, against the same agents, and the ratio printed:
before/after a change measured side by side, under the same load.
With --netns (root), 2 hosts in network namespaces are served too and the same warm
`monarch run` is timed on them (the inter-host path: TCP + CURVE) in the same rounds.

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
# The installed console script, as a user types it (else the module, for an uninstalled tree).
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "monarch")
MONARCH = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-m", "monarch_cli.main"]


NETNS_RUN = "monarch run -- python -c pass (2 hosts in netns)"


def compile_sources() -> None:
    """Byte-compile the tree as an install does: with PYTHONDONTWRITEBYTECODE set, a source edited
    since would otherwise be recompiled by every command we time."""
    import compileall

    for pkg in ("monarch_agents", "monarch", "monarch_cli", "monarch_schedulers"):
        compileall.compile_dir(os.path.join(ROOT, pkg), quiet=1)


#: CPU seconds (user + system) the timed command itself used, per command name: unlike wall time,
#: barely moved by other work on the machine, so a before/after compares on a busy machine too.
CPU: dict[str, list[float]] = {}


def timed(cmds: dict[str, list[str]], cwd: str, n: int, envs: dict[str, dict] | None = None,
          cwds: dict[str, str] | None = None) -> dict[str, list[float]]:
    """Wall times of each command, ``n`` rounds; a round runs every command once, so that a change
    in the machine's load during the run weighs on all of them alike.  Their CPU times go to CPU.
    ``cwds``: a folder of its own for some commands (another reservation)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    out: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(n):
        for name, cmd in cmds.items():
            t = time.perf_counter()
            p = subprocess.Popen(cmd, cwd=(cwds or {}).get(name, cwd), env={**env, **(envs or {}).get(name, {})},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(p.pid, 0)
            out[name].append(time.perf_counter() - t)
            p.returncode = os.waitstatus_to_exitcode(status)
            if p.returncode != 0:
                raise subprocess.CalledProcessError(p.returncode, cmd)
            CPU.setdefault(name, []).append(usage.ru_utime + usage.ru_stime)
    return out


def baseline_command(ref: str, workdir: str) -> tuple[list[str], dict[str, str]]:
    """`python -m monarch_cli.main` of commit ``ref``: its tree (older trees' agents/ and schedulers/
    linked under their installed names), first on PYTHONPATH."""
    tree = os.path.join(workdir, "baseline")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    # Trees from before the folders were their import names (agents/ installed as monarch_agents).
    links = os.path.join(workdir, "baseline-links")
    os.makedirs(links)
    for pkg in ("agents", "schedulers", "rdmafs", "telemetry"):
        if os.path.isdir(os.path.join(tree, pkg)) and not os.path.isdir(os.path.join(tree, f"monarch_{pkg}")):
            os.symlink(os.path.join(tree, pkg), os.path.join(links, f"monarch_{pkg}"))
    import compileall

    compileall.compile_dir(tree, quiet=1)
    return [sys.executable, "-m", "monarch_cli.main"], {"PYTHONPATH": os.pathsep.join([links, tree])}


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"p50_ms": round(statistics.median(xs) * 1000, 1), "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 1)}


_THIS = "this tree: python -m monarch_cli.main run"
_BASE = "baseline: python -m monarch_cli.main run"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--baseline", metavar="GIT-REF", help="also time the monarch of this commit, side by side")
    ap.add_argument("--netns", action="store_true", help="also 2 hosts in network namespaces (root)")
    a = ap.parse_args()
    compile_sources()
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as dn:
        env = {**os.environ, "PYTHONPATH": ROOT}
        subprocess.run([*MONARCH, "serve", "--hosts", "2"], cwd=d, env=env, check=True, stderr=subprocess.DEVNULL)
        if a.netns:
            subprocess.run([*MONARCH, "serve", "--hosts", "2", "--netns"], cwd=dn, env=env, check=True,
                           stderr=subprocess.DEVNULL)
        try:
            cmds = {
                "bare python -c pass": [sys.executable, "-c", "pass"],
                "monarch run -- python -c pass (2 hosts)": [*MONARCH, "run", "--", sys.executable, "-c", "pass"],
                "monarch status": [*MONARCH, "status"],
            }
            envs = {}
            if a.baseline:
                # Both as `python -m monarch_cli.main`, so that only the code differs.
                base, base_env = baseline_command(a.baseline, os.path.join(d, "_bench"))
                cmds[_THIS] = [sys.executable, "-m", "monarch_cli.main", "run", "--", sys.executable, "-c", "pass"]
                cmds[_BASE] = [*base, "run", "--", sys.executable, "-c", "pass"]
                envs[_BASE] = base_env
            cwds = {}
            if a.netns:  # the same command in the netns reservation's folder
                cmds[NETNS_RUN] = [*MONARCH, "run", "--", sys.executable, "-c", "pass"]
                cwds[NETNS_RUN] = dn
            times = timed(cmds, d, a.n, envs, cwds)
            times.update(timed({"torchrun --standalone cold start": [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "--no-python", "true"]},
                d, max(3, a.n // 3)))
            res = {k: summary(v) for k, v in times.items()}
        finally:
            subprocess.run([*MONARCH, "stop"], cwd=d, env=env, stderr=subprocess.DEVNULL)
            if a.netns:
                subprocess.run([*MONARCH, "stop"], cwd=dn, env=env, stderr=subprocess.DEVNULL)
    bare = res["bare python -c pass"]["p50_ms"]
    mon = res["monarch run -- python -c pass (2 hosts)"]["p50_ms"]
    tr = res["torchrun --standalone cold start"]["p50_ms"]
    ratios = {"monarch overhead over bare (ms, p50)": round(mon - bare, 1),
              "monarch run / torchrun cold start": round(mon / tr, 3)}
    cpu = {k: round(statistics.median(v) * 1000, 1) for k, v in CPU.items()}
    if a.baseline:
        this, base = res[_THIS]["p50_ms"], res[_BASE]["p50_ms"]
        ratios[f"overhead this / {a.baseline} (p50, over bare)"] = round((this - bare) / max(base - bare, 1e-9), 3)
        ratios[f"monarch run this - {a.baseline} (ms, p50)"] = round(this - base, 1)
        ratios[f"CPU of monarch run, this / {a.baseline} (p50)"] = round(cpu[_THIS] / max(cpu[_BASE], 1e-9), 3)
        ratios[f"CPU of monarch run, this - {a.baseline} (ms, p50)"] = round(cpu[_THIS] - cpu[_BASE], 1)
    if NETNS_RUN in res:
        ratios["inter-host run / same-host run (p50)"] = round(res[NETNS_RUN]["p50_ms"] / mon, 3)
    if a.json:
        print(json.dumps({"results": res, "cpu_p50_ms": cpu, "ratios": ratios}, indent=2))
        return
    for k, v in res.items():
        print(f"{k:45s} p50 {v['p50_ms']:8.1f} ms   p90 {v['p90_ms']:8.1f} ms   CPU p50 {cpu[k]:7.1f} ms")
    for k, v in ratios.items():
        print(f"{k:45s} {v}")


if __name__ == "__main__":
    main()
