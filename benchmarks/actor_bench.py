#!/usr/bin/env python
"""Actor-runtime micro-benchmarks, runnable against this monarch or PyTorch Monarch.

    .venv/bin/python benchmarks/actor_bench.py                 # ours, table
    .venv/bin/python benchmarks/actor_bench.py --quick --json  # ours, few iterations, JSON on stdout
    .venv/bin/python benchmarks/actor_bench.py --impl torchmonarch --torchmonarch-python tm/bin/python
    .venv/bin/python benchmarks/actor_bench.py --compare       # both, with ratios
    .venv/bin/python benchmarks/actor_bench.py --inter-host    # same-host vs a host in a network namespace (root)

Both packages are importable as ``monarch``, so each implementation runs in
an interpreter of its own: ``--compare`` (and ``--impl torchmonarch`` with
``--torchmonarch-python``) run this same script in a subprocess with the right
interpreter and ``--child``, and read its JSON back.

What is measured (every value is a median unless its name says p99):

* ``call_one_p50_us`` / ``call_one_p99_us``: ``call_one().get()`` round trip on a
  one-proc mesh, over ~2000 calls after a warmup.
* ``call_N_p50_us``: ``call().get()`` over an N-actor mesh (N = 2, 4, 8).
* ``throughput_msg_s``: 5,000 ``call_one`` futures issued, then all got;
  5000 / elapsed.
* ``bytes_echo_*_MBps`` / ``tensor_echo_*_MBps``: an endpoint returns its
  argument; MB/s = payload bytes / 1e6 / round-trip time.
* ``spawn_N_ms``: ``spawn_procs(per_host={"gpus": N})`` + ``spawn`` + the first
  ``call()`` on the whole mesh answered (host already warm).
* ``cold_start_ms``: a fresh ``python -c`` that imports monarch.actor, spawns one
  proc and actor and calls it: launch to first reply (wall clock); ours with the
  user's shared host agent warm (``benchmarks/cold_start_bench.py`` has both kinds).
* ``death_detect_ms``: a proc is killed (SIGKILL) while a call to it is pending:
  time from the kill until that call's future raises; capped (``--death-cap``).

``--inter-host`` (root: it serves ``monarch serve --hosts 1 --netns``) measures
the calls and echoes twice, each in a process of its own: procs on this host
(same-host path: Unix sockets, shared memory) and procs on a host in its own
network namespace (inter-host path: TCP with CURVE, as between machines), and
prints inter/same ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
#: Where torchmonarch's interpreter is looked for when --torchmonarch-python is not given, in order
#: (the same places as tests/compat and the other benchmarks; ``TORCHMONARCH_PYTHON`` first).
TM_PYTHONS = [os.environ.get("TORCHMONARCH_PYTHON", ""), os.path.join(REPO, ".tm-venv", "bin", "python")]
DEFAULT_TM_PYTHON = next((p for p in TM_PYTHONS if p and os.path.exists(p)), TM_PYTHONS[1])
GET_TIMEOUT_S = 120.0
MiB = 1 << 20
ECHO_SIZES = [("1KiB", 1 << 10), ("1MiB", MiB), ("16MiB", 16 * MiB), ("64MiB", 64 * MiB)]
CALL_MESH_SIZES = [2, 4, 8]
SPAWN_SIZES = [1, 2, 4, 8]
THROUGHPUT_CALLS = 5000

# (key, label, unit, kind): kind "time" is lower-is-better, "rate" higher-is-better.
METRICS: list[tuple[str, str, str, str]] = [
    ("call_one_p50_us", "call_one round trip p50", "us", "time"),
    ("call_one_p99_us", "call_one round trip p99", "us", "time"),
    *[(f"call_{n}_p50_us", f"call() over {n} actors p50", "us", "time") for n in CALL_MESH_SIZES],
    ("throughput_msg_s", f"throughput, {THROUGHPUT_CALLS} outstanding call_one", "msg/s", "rate"),
    *[(f"bytes_echo_{name}_MBps", f"bytes echo {name}", "MB/s", "rate") for name, _ in ECHO_SIZES],
    *[(f"tensor_echo_{name}_MBps", f"torch tensor echo {name}", "MB/s", "rate") for name, _ in ECHO_SIZES],
    *[(f"spawn_{n}_ms", f"spawn {n} proc{'s' if n > 1 else ''} to first reply", "ms", "time") for n in SPAWN_SIZES],
    ("cold_start_ms", "cold start (python -c) to first reply", "ms", "time"),
    ("death_detect_ms", "proc SIGKILL to pending call raising", "ms", "time"),
]
METRIC_KEYS = [k for k, *_ in METRICS]

#: What --inter-host measures on both paths.
INTER_HOST_KEYS = ["call_one_p50_us", "call_one_p99_us", "call_8_p50_us", "throughput_msg_s",
                   "bytes_echo_1MiB_MBps", "bytes_echo_64MiB_MBps", "tensor_echo_64MiB_MBps"]

# torchmonarch 0.7.0, measured earlier on this machine kind.
REFERENCE = {
    "call_one_p50_us": 466.0,
    "call_8_p50_us": 2300.0,
    "throughput_msg_s": 6600.0,
    "bytes_echo_64MiB_MBps": 375.0,
    "spawn_8_ms": 836.0,
    "death_detect_ms": 10000.0,
}


def log(msg: str) -> None:
    print(f"[actor_bench] {msg}", file=sys.stderr, flush=True)


# --- the implementation under test ---------------------------------------------


class Api:
    """monarch.actor (ours or PyTorch Monarch's) and the benchmark's actor class."""

    def __init__(self, impl: str, job_state: str | None = None):
        self.impl = impl
        self.job_state = job_state
        if impl == "monarch":
            if REPO not in sys.path:
                sys.path.insert(0, REPO)
        else:
            # Never pick up this repo's `monarch` package by accident.
            sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (REPO, os.path.abspath(REPO))]
        try:
            import torch  # noqa: F401  (imported before any proc exists, the same for both)
        except ImportError:
            pass
        import monarch.actor as actor_api

        self.mod = actor_api
        self.module_file = getattr(actor_api, "__file__", "?")
        in_repo = os.path.abspath(self.module_file).startswith(REPO + os.sep)
        if impl == "monarch" and not in_repo:
            raise RuntimeError(f"--impl monarch imported {self.module_file}, not this repo's monarch")
        if impl == "torchmonarch" and in_repo:
            raise RuntimeError(f"--impl torchmonarch imported this repo's monarch ({self.module_file}); "
                               f"run it with the torchmonarch interpreter (--torchmonarch-python)")
        self.Bench = _define_bench_actor(actor_api.Actor, actor_api.endpoint)

    def host(self) -> Any:
        """Where procs go: this machine, or the first host of ``--job-state``'s reservation."""
        if self.job_state is None:
            return self.mod.this_host()
        from monarch.job import job_load

        return job_load(self.job_state).state().hosts.slice(hosts=0)

    def spawn(self, n: int, name: str = "bench") -> tuple[Any, Any]:
        procs = self.host().spawn_procs(per_host={"gpus": n})
        try:
            return procs, procs.spawn(name, self.Bench)
        except BaseException:
            _stop(procs)
            raise

    def silence_faults(self) -> None:
        """Keep the process alive (and quiet) when a proc it owns dies."""
        self.mod.unhandled_fault_hook = lambda failure: None


def _define_bench_actor(actor_base: type, endpoint: Callable) -> type:
    class Bench(actor_base):  # type: ignore[misc, valid-type]
        @endpoint
        def ping(self, x: Any = None) -> Any:
            return x

        @endpoint
        def echo(self, x: Any) -> Any:
            return x

        @endpoint
        def pid(self) -> int:
            return os.getpid()

        @endpoint
        def sleep(self, seconds: float) -> float:
            time.sleep(seconds)
            return seconds

    return Bench


def _stop(procs: Any, timeout: float = 30.0) -> None:
    try:
        procs.stop().get(timeout=timeout)
    except Exception as e:  # a benchmark is not the place to fail on cleanup
        log(f"stopping procs failed: {type(e).__name__}: {e}")


# --- statistics ----------------------------------------------------------------


def percentile(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100.0 * len(s)) - 1))]


# --- measurements (each returns {key: number}) ---------------------------------


class Config:
    def __init__(self, quick: bool, death_cap_s: float):
        self.quick = quick
        self.death_cap_s = death_cap_s
        self.call_one_warmup, self.call_one_n = (20, 200) if quick else (200, 2000)
        self.call_n_warmup, self.call_n_n = (10, 50) if quick else (50, 500)
        self.throughput_warmup = 200 if quick else 1000
        self.echo_reps = {"1KiB": 5, "1MiB": 3, "16MiB": 2, "64MiB": 2} if quick else \
                         {"1KiB": 50, "1MiB": 20, "16MiB": 5, "64MiB": 5}
        self.spawn_reps = 1 if quick else 3
        self.cold_reps = 1 if quick else 3
        self.death_reps = 1 if quick else 3


def m_call_one(api: Api, cfg: Config, actor: Any) -> dict:
    for i in range(cfg.call_one_warmup):
        actor.ping.call_one(i).get(timeout=GET_TIMEOUT_S)
    lat = []
    for i in range(cfg.call_one_n):
        t = time.perf_counter()
        actor.ping.call_one(i).get(timeout=GET_TIMEOUT_S)
        lat.append(time.perf_counter() - t)
    return {"call_one_p50_us": percentile(lat, 50) * 1e6, "call_one_p99_us": percentile(lat, 99) * 1e6}


def m_throughput(api: Api, cfg: Config, actor: Any) -> dict:
    for f in [actor.ping.call_one(i) for i in range(cfg.throughput_warmup)]:
        f.get(timeout=GET_TIMEOUT_S)
    t = time.perf_counter()
    futures = [actor.ping.call_one(i) for i in range(THROUGHPUT_CALLS)]
    for f in futures:
        f.get(timeout=GET_TIMEOUT_S)
    dt = time.perf_counter() - t
    return {"throughput_msg_s": THROUGHPUT_CALLS / dt}


def _echo_rate(actor: Any, payload: Any, nbytes: int, reps: int, check: Callable[[Any], bool]) -> float:
    got = actor.echo.call_one(payload).get(timeout=GET_TIMEOUT_S)  # warmup, and a correctness check
    if not check(got):
        raise RuntimeError(f"echo returned a different value ({type(got).__name__})")
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        actor.echo.call_one(payload).get(timeout=GET_TIMEOUT_S)
        times.append(time.perf_counter() - t)
    return nbytes / 1e6 / statistics.median(times)


def m_bytes_echo(api: Api, cfg: Config, actor: Any, name: str, size: int) -> dict:
    payload = os.urandom(size)
    rate = _echo_rate(actor, payload, size, cfg.echo_reps[name], lambda v: v == payload)
    return {f"bytes_echo_{name}_MBps": rate}


def m_tensor_echo(api: Api, cfg: Config, actor: Any, name: str, size: int) -> dict:
    import torch

    t = torch.randint(0, 256, (size,), dtype=torch.uint8)
    rate = _echo_rate(actor, t, size, cfg.echo_reps[name],
                      lambda v: isinstance(v, torch.Tensor) and v.shape == t.shape and bool(torch.equal(v, t)))
    return {f"tensor_echo_{name}_MBps": rate}


def m_call_n(api: Api, cfg: Config, n: int) -> dict:
    procs, actors = api.spawn(n, f"call{n}")
    try:
        for i in range(cfg.call_n_warmup):
            actors.ping.call(i).get(timeout=GET_TIMEOUT_S)
        lat = []
        for i in range(cfg.call_n_n):
            t = time.perf_counter()
            vm = actors.ping.call(i).get(timeout=GET_TIMEOUT_S)
            lat.append(time.perf_counter() - t)
        if len(vm) != n:
            raise RuntimeError(f"call() answered with {len(vm)} values, expected {n}")
        return {f"call_{n}_p50_us": percentile(lat, 50) * 1e6}
    finally:
        _stop(procs)


def m_spawn(api: Api, cfg: Config, n: int) -> dict:
    times = []
    for rep in range(cfg.spawn_reps):
        t = time.perf_counter()
        procs = api.host().spawn_procs(per_host={"gpus": n})
        try:
            actors = procs.spawn(f"spawn{n}_{rep}", api.Bench)
            vm = actors.ping.call(1).get(timeout=GET_TIMEOUT_S)
            times.append(time.perf_counter() - t)
            if len(vm) != n:
                raise RuntimeError(f"call() answered with {len(vm)} values, expected {n}")
        finally:
            _stop(procs)
    return {f"spawn_{n}_ms": statistics.median(times) * 1e3}


COLD_START_CODE = r"""
import sys, time
from monarch.actor import Actor, endpoint, this_host
class Pinger(Actor):
    @endpoint
    def ping(self):
        return 42
procs = this_host().spawn_procs(per_host={"gpus": 1})
actor = procs.spawn("pinger", Pinger)
assert actor.ping.call_one().get(timeout=120) == 42
print("COLD_FIRST_REPLY", repr(time.time()), flush=True)
procs.stop().get(timeout=30)
"""


def _child_env(impl: str) -> tuple[dict, str]:
    env = dict(os.environ)
    if impl == "monarch":
        env["PYTHONPATH"] = os.pathsep.join([REPO, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
        return env, REPO
    env.pop("PYTHONPATH", None)
    return env, tempfile.gettempdir()


def m_cold_start(api: Api, cfg: Config) -> dict:
    env, cwd = _child_env(api.impl)
    if api.impl != "monarch":
        return _cold_start(env, cwd, cfg.cold_reps)
    # Ours with the user's shared host agent warm (started by one run first, unmeasured), in a
    # runtime folder of this benchmark whose agent is stopped at the end (cold_start_bench.py
    # has the timeline, and the runs that start an agent of their own).
    rt_dir = tempfile.mkdtemp(prefix="actor_bench_rt_")
    env = {**env, "MONARCH_SHARED_AGENT": "1", "MONARCH_RUNTIME_DIR": rt_dir}
    try:
        first = _cold_start(env, cwd, 1)["cold_start_ms"]
        log(f"cold start that started the shared agent: {first:.0f} ms")
        return _cold_start(env, cwd, cfg.cold_reps)
    finally:
        import psutil

        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "--shared-socket" in cmd and cmd[cmd.index("--shared-socket") + 1].startswith(rt_dir):
                try:
                    p.terminate()  # the agent stops its zygote (a fork of it, with the same command line)
                except psutil.Error:
                    pass
        shutil.rmtree(rt_dir, ignore_errors=True)


def _cold_start(env: dict, cwd: str, reps: int) -> dict:
    firsts, totals = [], []
    for _ in range(reps):
        t0 = time.time()
        p = subprocess.run([sys.executable, "-c", COLD_START_CODE], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=300)
        total = time.time() - t0
        stamp = [ln for ln in p.stdout.splitlines() if ln.startswith("COLD_FIRST_REPLY ")]
        if p.returncode != 0 or not stamp:
            raise RuntimeError(f"cold-start child exited {p.returncode}: {_tail(p.stderr or p.stdout)}")
        firsts.append(float(stamp[-1].split()[1]) - t0)
        totals.append(total)
    log(f"cold start: first reply {statistics.median(firsts) * 1e3:.0f} ms, process exit "
        f"{statistics.median(totals) * 1e3:.0f} ms")
    return {"cold_start_ms": statistics.median(firsts) * 1e3}


def run_death_child(api: Api, cap_s: float) -> dict:
    """In a process of its own: kill the only proc while a call to it is pending."""
    api.silence_faults()
    procs, actor = api.spawn(1, "victim")
    pid = actor.pid.call_one().get(timeout=GET_TIMEOUT_S)
    pending = actor.sleep.call_one(3600)
    time.sleep(0.5)  # let the call reach the actor, which then sleeps in it
    done = getattr(pending, "done", None)  # PyTorch Monarch's Future has no done()
    if done is not None and done():
        raise RuntimeError("the pending call finished before the kill")
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    try:
        pending.get(timeout=cap_s)
    except TimeoutError:
        return {"death_detect_ms": None, "capped": True, "elapsed_ms": (time.perf_counter() - t0) * 1e3}
    except Exception as e:
        dt = time.perf_counter() - t0
        if dt >= cap_s * 0.99 and "timeout" in type(e).__name__.lower():
            return {"death_detect_ms": None, "capped": True, "elapsed_ms": dt * 1e3}
        return {"death_detect_ms": dt * 1e3, "capped": False, "raised": f"{type(e).__name__}: {str(e)[:200]}"}
    raise RuntimeError("the pending call returned a value although its proc was killed")


def m_death(api: Api, cfg: Config) -> dict:
    env, cwd = _child_env(api.impl)
    cap_s = cfg.death_cap_s
    times, capped = [], False
    for _ in range(cfg.death_reps):
        cmd = [sys.executable, os.path.abspath(__file__), "--impl", api.impl, "--death-child",
               "--death-cap", str(cap_s)]
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=cap_s + 180)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("DEATH_JSON ")]
        if not lines:
            raise RuntimeError(f"death child exited {p.returncode} without a result: {_tail(p.stderr or p.stdout)}")
        r = json.loads(lines[-1][len("DEATH_JSON "):])
        if "error" in r:
            raise RuntimeError(r["error"])
        if r["capped"]:
            capped = True
            log(f"death detection: no error within the {cap_s:.0f} s cap")
            break  # the next tries would take as long
        log(f"death detection: {r['death_detect_ms']:.0f} ms ({r.get('raised', '')[:120]})")
        times.append(r["death_detect_ms"])
    if capped:
        return {"death_detect_ms": cap_s * 1e3, "__capped__": ["death_detect_ms"]}
    return {"death_detect_ms": statistics.median(times)}


def _tail(text: str, n: int = 600) -> str:
    text = (text or "").strip()
    return ("..." + text[-n:]) if len(text) > n else text


# --- driver ------------------------------------------------------------------


def run_all(impl: str, cfg: Config, only: list[str] | None = None, job_state: str | None = None) -> dict:
    out: dict[str, Any] = {
        "impl": impl, "quick": cfg.quick, "python": sys.executable, "python_version": platform.python_version(),
        "host": platform.node(), "cpus": os.cpu_count(), "results": {k: None for k in METRIC_KEYS},
        "errors": {}, "capped": [], "seconds": {}, "load_start": list(os.getloadavg()),
    }

    def record(key_hint: str, fn: Callable[[], dict]) -> None:
        if only is not None and key_hint != "main_mesh" and not any(k.startswith(key_hint) for k in only):
            return
        t = time.perf_counter()
        log(f"{impl}: {key_hint} ...")
        try:
            r = fn()
            out["capped"].extend(r.pop("__capped__", []))
            out["results"].update(r)
        except BaseException as e:  # noqa: BLE001 -- report, never crash
            if isinstance(e, KeyboardInterrupt):
                raise
            msg = f"error: {type(e).__name__}: {str(e)[:300]}"
            log(f"{impl}: {key_hint}: {msg}")
            if os.environ.get("ACTOR_BENCH_TRACEBACK"):
                traceback.print_exc()
            for k in METRIC_KEYS:
                if k.startswith(key_hint) and out["results"].get(k) is None:
                    out["errors"][k] = msg
        out["seconds"][key_hint] = round(time.perf_counter() - t, 2)

    try:
        api = Api(impl, job_state)
    except BaseException as e:  # noqa: BLE001
        msg = f"error: {type(e).__name__}: {e}"
        out["errors"] = {k: msg for k in METRIC_KEYS}
        return out
    out["module"] = api.module_file
    try:
        from importlib.metadata import version

        out["version"] = version("torchmonarch") if impl == "torchmonarch" else version("monarch-workbench")
    except Exception:
        out["version"] = "?"

    main: dict[str, Any] = {}

    def start_main() -> dict:
        main["procs"], main["actor"] = api.spawn(1, "main")
        main["actor"].ping.call_one(0).get(timeout=GET_TIMEOUT_S)
        return {}

    record("main_mesh", start_main)
    actor = main.get("actor")

    def needs_main(fn: Callable[..., dict], *a: Any) -> Callable[[], dict]:
        def run() -> dict:
            if actor is None:
                raise RuntimeError(f"no one-proc mesh: {out['errors'].get('main_mesh', 'spawn failed')}")
            return fn(api, cfg, actor, *a)
        return run

    record("call_one", needs_main(m_call_one))
    record("throughput", needs_main(m_throughput))
    for name, size in ECHO_SIZES:
        record(f"bytes_echo_{name}", needs_main(m_bytes_echo, name, size))
    for name, size in ECHO_SIZES:
        record(f"tensor_echo_{name}", needs_main(m_tensor_echo, name, size))
    if "procs" in main:
        _stop(main["procs"])
    for n in CALL_MESH_SIZES:
        record(f"call_{n}_", lambda n=n: m_call_n(api, cfg, n))
    for n in SPAWN_SIZES:
        record(f"spawn_{n}_", lambda n=n: m_spawn(api, cfg, n))
    record("cold_start", lambda: m_cold_start(api, cfg))
    record("death_detect", lambda: m_death(api, cfg))
    out["load_end"] = list(os.getloadavg())
    # A failed main mesh has no metric key of its own: blame it where it mattered.
    out["errors"].pop("main_mesh", None)
    for k in (only or METRIC_KEYS):
        if out["results"].get(k) is None and k not in out["errors"]:
            out["errors"][k] = "error: not measured"
    return out


def run_impl_subprocess(impl: str, python: str, args: argparse.Namespace, extra: list[str] = ()) -> dict:
    """This script, under ``python``, with ``--impl impl --child``; its JSON result."""
    env, cwd = _child_env(impl)
    with tempfile.TemporaryDirectory(prefix="actor_bench_") as d:
        path = os.path.join(d, "result.json")
        cmd = [python, os.path.abspath(__file__), "--impl", impl, "--child", "--json-file", path,
               "--death-cap", str(args.death_cap), *extra]
        if args.quick:
            cmd.append("--quick")
        log(f"running {impl} under {python}")
        try:
            p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=None, text=True,
                               timeout=args.child_timeout)
            rc = p.returncode
        except (OSError, subprocess.TimeoutExpired) as e:
            rc, p = f"{type(e).__name__}: {e}", None
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        msg = f"error: {impl} run failed ({rc})"
        return {"impl": impl, "python": python, "results": {k: None for k in METRIC_KEYS},
                "errors": {k: msg for k in METRIC_KEYS}, "capped": []}


# --- output --------------------------------------------------------------------


def _fmt(value: Any, unit: str, capped: bool = False) -> str:
    if value is None:
        return "-"
    if capped:
        return f">{value / 1e3:.0f} s" if unit == "ms" else f">{value:g}"
    if unit == "us":
        return f"{value:,.1f} us" if value < 10_000 else f"{value / 1e3:,.2f} ms"
    if unit == "ms":
        return f"{value:,.0f} ms" if value >= 100 else f"{value:,.1f} ms"
    if unit == "msg/s":
        return f"{value:,.0f} msg/s"
    if unit == "MB/s":
        return f"{value:,.1f} MB/s" if value < 100 else f"{value:,.0f} MB/s"
    return f"{value:g} {unit}"


def _cell(run: dict, key: str, unit: str) -> str:
    err = run.get("errors", {}).get(key)
    v = run.get("results", {}).get(key)
    if v is None:
        return (err or "-")[:48]
    return _fmt(v, unit, key in run.get("capped", []))


def _ratio(ours: dict, theirs_value: float | None, theirs_capped: bool, key: str, kind: str) -> str:
    a = ours.get("results", {}).get(key)
    if a is None or theirs_value in (None, 0):
        return "-"
    ours_capped = key in ours.get("capped", [])
    if ours_capped and theirs_capped:
        return "?"
    r = a / theirs_value  # times: ours/theirs; rates: ours/theirs as well (see the legend)
    s = f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"
    if theirs_capped:  # theirs is at least the cap
        return ("<" if kind == "time" else ">") + s
    if ours_capped:
        return (">" if kind == "time" else "<") + s
    return s


def ratios(ours: dict, theirs: dict) -> dict:
    out = {}
    for key, _, _, _kind in METRICS:
        a, b = ours.get("results", {}).get(key), theirs.get("results", {}).get(key)
        out[key] = (a / b) if (a is not None and b) else None
    return out


def render_table(ours: dict, theirs: dict | None, first: str = "monarch") -> str:
    head = ["measurement", first]
    if theirs is not None:
        head += ["torchmonarch", "ratio"]
    head += ["reference (tm)", "vs ref"]
    rows = [head]
    for key, label, unit, kind in METRICS:
        row = [label, _cell(ours, key, unit)]
        if theirs is not None:
            row += [_cell(theirs, key, unit),
                    _ratio(ours, theirs.get("results", {}).get(key), key in theirs.get("capped", []), key, kind)]
        ref = REFERENCE.get(key)
        row += [_fmt(ref, unit) if ref is not None else "", _ratio(ours, ref, False, key, kind) if ref else ""]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    who = "monarch / torchmonarch" if theirs is not None else f"{first} / reference"
    lines.append(f"ratio, vs ref = {who} for every row: for times (us, ms) below 1 means {first} is faster; "
                 f"for throughputs (msg/s, MB/s) above 1 means {first} is faster.")
    lines.append("MB/s = payload bytes / 1e6 / median round trip.  spawn = spawn_procs + spawn + first call() on "
                 "the whole mesh answered.  '>N s' = no error within the cap.")
    lines.append(f"reference = torchmonarch 0.7.0 measured earlier on this machine kind.  "
                 f"cpus here: {os.cpu_count()}{'  (--quick: few iterations)' if ours.get('quick') else ''}")
    loads = [f"{r['impl']} {r['load_start'][0]:.2f} -> {r['load_end'][0]:.2f}" for r in (ours, theirs)
             if r and r.get("load_start") and r.get("load_end")]
    if loads:
        lines.append("load average (1 min) during each run: " + ", ".join(loads))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    # Every process of ours here starts a host agent of its own, gone with it (the cold start
    # measures the shared one in a folder of its own): nothing outlives the benchmark.
    os.environ.setdefault("MONARCH_SHARED_AGENT", "0")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=["monarch", "torchmonarch"], default="monarch")
    ap.add_argument("--torchmonarch-python", default=None,
                    help=f"interpreter with torchmonarch installed (default: the first that exists of "
                         f"$TORCHMONARCH_PYTHON, {', '.join(p for p in TM_PYTHONS[1:])})")
    ap.add_argument("--monarch-python", default=sys.executable, help="interpreter for ours under --compare")
    ap.add_argument("--compare", action="store_true", help="run both implementations and print ratios")
    ap.add_argument("--quick", action="store_true", help="few iterations (smoke test)")
    ap.add_argument("--json", action="store_true", help="print JSON on stdout (the table goes to stderr)")
    ap.add_argument("--json-file", default=None, help="also write the JSON here")
    ap.add_argument("--death-cap", type=float, default=30.0, help="seconds to wait for a death to be noticed")
    ap.add_argument("--child-timeout", type=float, default=1800.0, help="seconds for each implementation's run")
    ap.add_argument("--inter-host", action="store_true",
                    help="same-host path vs a host in its own network namespace (root; TCP + CURVE)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--death-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="",
                    help="comma-separated metric key prefixes to measure (e.g. call_one,throughput,call_8_)")
    ap.add_argument("--job-state", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.death_child:
        return _death_child_main(args)
    if args.inter_host and not args.child:
        return _inter_host_main(args)

    tm_python = args.torchmonarch_python or (DEFAULT_TM_PYTHON if os.path.exists(DEFAULT_TM_PYTHON) else None)
    cfg = Config(args.quick, args.death_cap)
    theirs: dict | None = None
    if args.compare:
        # --only narrows both runs (e.g. the message hot path: call_one,throughput,call_8_).
        only = ["--only", args.only] if args.only else []
        ours = run_impl_subprocess("monarch", args.monarch_python, args, only)
        if tm_python is None:
            log("no torchmonarch interpreter (--torchmonarch-python); comparing with the reference column only")
        else:
            theirs = run_impl_subprocess("torchmonarch", tm_python, args, only)
        result: dict = {"monarch": ours, "torchmonarch": theirs, "reference_torchmonarch": REFERENCE,
                        "metrics": {k: {"label": label, "unit": unit, "kind": kind} for k, label, unit, kind in METRICS}}
        if theirs is not None:
            result["ratios_monarch_over_torchmonarch"] = ratios(ours, theirs)
    elif args.impl == "torchmonarch" and not args.child and args.torchmonarch_python:
        ours = run_impl_subprocess("torchmonarch", args.torchmonarch_python, args)
        result = ours
    else:
        ours = run_all(args.impl, cfg, only=args.only.split(",") if args.only else None, job_state=args.job_state)
        result = ours

    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
    if args.child:
        _exit_soon()
        return 0
    if args.impl == "torchmonarch" and not args.compare:
        table = render_table(ours, None, first="torchmonarch")
    else:
        table = render_table(ours, theirs)
    if args.json:
        print(table, file=sys.stderr, flush=True)
        print(json.dumps(result, indent=2, sort_keys=True), flush=True)
    else:
        print(table, flush=True)
    _exit_soon()
    return 0


def _inter_host_main(args: argparse.Namespace) -> int:
    """Same-host vs inter-host, one process each, on a 1-host ``--netns`` reservation served here."""
    cli = [sys.executable, "-m", "monarch_cli.main"]
    env = {**os.environ, "PYTHONPATH": REPO}
    with tempfile.TemporaryDirectory(prefix="actor_bench_netns_") as d:
        r = subprocess.run([*cli, "--json", "serve", "--hosts", "1", "--netns"], cwd=d, env=env,
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log(f"could not serve a --netns host: {r.stderr.strip()}")
            return 1
        try:
            only = ["--only", ",".join(INTER_HOST_KEYS)]
            same = run_impl_subprocess("monarch", args.monarch_python, args, only)
            inter = run_impl_subprocess("monarch", args.monarch_python, args,
                                        [*only, "--job-state", os.path.join(d, ".monarch", "job_state.pkl")])
        finally:
            subprocess.run([*cli, "stop"], cwd=d, env=env, capture_output=True, timeout=60)
    result = {"same_host": same, "inter_host": inter,
              "ratios_inter_over_same": ratios(inter, same), "reference_torchmonarch": REFERENCE}
    rows = [("measurement", "same host", "inter-host (netns)", "inter/same", "reference (tm, same host)")]
    for key, label, unit, kind in METRICS:
        if key in INTER_HOST_KEYS:
            ref = REFERENCE.get(key)
            rows.append((label, _cell(same, key, unit), _cell(inter, key, unit),
                         _ratio(inter, same["results"].get(key), False, key, kind), _fmt(ref, unit) if ref else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
                      for r in rows)
    table += ("\n\nsame host: procs on this host (Unix sockets, shared memory); inter-host: procs on a host in its "
              "own network namespace (TCP + CURVE, as between machines).  inter/same: for times above 1 means "
              "the inter-host path is slower; for rates below 1.")
    if args.json_file:
        with open(args.json_file, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
    if args.json:
        print(table, file=sys.stderr, flush=True)
        print(json.dumps(result, indent=2, sort_keys=True), flush=True)
    else:
        print(table, flush=True)
    return 0


def _death_child_main(args: argparse.Namespace) -> int:
    try:
        r = run_death_child(Api(args.impl), args.death_cap)
    except BaseException as e:  # noqa: BLE001
        r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print("DEATH_JSON " + json.dumps(r), flush=True)
    sys.stderr.flush()
    os._exit(0)  # the runtime saw one of its procs die: do not wait on its shutdown


def _exit_soon(grace_s: float = 30.0) -> None:
    """Leave time for a clean shutdown, but never hang on it."""
    def bail() -> None:
        time.sleep(grace_s)
        log("shutdown took too long; exiting")
        sys.stdout.flush()
        os._exit(0)

    threading.Thread(target=bail, daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
