#!/usr/bin/env python
"""Telemetry benchmarks: query speed across hosts, the cost of recording, and the memory bound.

    .venv/bin/python benchmarks/telemetry_bench.py            # everything, a table of figures and ratios
    .venv/bin/python benchmarks/telemetry_bench.py --quick --json

What is measured, in one run:

* ``query``: 4 real host agents (``monarch serve --hosts 4``, local scheduler) each hold
  ``--rows`` (default 1M) ``messages`` rows, pushed to them the way procs push theirs.  A
  grouped aggregate (count, avg and p99 of ``latency_us`` by ``endpoint``) goes through
  ``monarch._workbench.telemetry.query`` (plan, scans on every agent, merge); p50 over ``--repeat``
  runs.  Baseline: the same SQL in this process over one in-memory table holding all 4x rows
  (no hosts, no wire): the ratio is what asking four agents costs over the ideal.
* ``recording``: ``call_one`` round-trip p50 and outstanding-call throughput (``--calls``
  futures issued, then all got) on a one-actor mesh, in a fresh program with recording on
  (``MONARCH_TELEMETRY=1``, the default) and off (``=0``), rounds interleaved; ratio on/off.
* ``memory``: 1M handled messages recorded through a Recorder into a Store whose tables are
  bounded (``--bound-mib``); the largest ``messages`` table seen and the process's RSS growth.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

#: The issue's example (p99 by endpoint), and a plain grouped aggregate.
QUERY = ("SELECT endpoint, count(*) AS n, avg(latency_us) AS mean_us, "
         "approx_percentile_cont(latency_us, 0.99) AS p99_us FROM messages_ext GROUP BY endpoint ORDER BY endpoint")
QUERY_SIMPLE = ("SELECT endpoint, count(*) AS n, avg(latency_us) AS mean_us, max(latency_us) AS max_us "
                "FROM messages_ext GROUP BY endpoint ORDER BY endpoint")
ENDPOINTS = ["step", "forward", "backward", "load", "save", "ping", "gather", "reduce"]


# -- query over 4 hosts ---------------------------------------------------------------------


def _message_log(n: int, seed: int) -> tuple[int, list]:
    """``n`` handled-message rows as a proc's Recorder buffers them (columns of _message_log)."""
    import array

    rnd = random.Random(seed)
    t0 = 1_700_000_000_000_000
    ids = array.array("q", range(seed << 40, (seed << 40) + n))
    queued = array.array("q", (t0 + i * 10 for i in range(n)))
    active = array.array("q", (q + rnd.randrange(0, 50) for q in queued))
    done = array.array("q", (a + int(rnd.expovariate(1 / 300)) + 1 for a in active))
    frm = array.array("q", [7] * n)
    to = array.array("q", (seed * 100 + i % 16 for i in range(n)))
    endpoint = [ENDPOINTS[i % len(ENDPOINTS)] for i in range(n)]
    port = [None] * n
    host = [f"host{seed}"] * n
    status = ["complete"] * n
    return n, [ids, queued, active, done, frm, to, endpoint, port, host, status]


def bench_query(rows: int, repeat: int, workdir: str) -> dict:
    from datafusion import SessionContext

    from monarch_agents.client import ensure_runtime
    from monarch_agents.messages import Ping, TelemetryRows
    from monarch._workbench.reserve import load_live
    from monarch._workbench.telemetry import query
    from monarch_telemetry.recorder import derive_messages

    env = {**os.environ, "PYTHONPATH": REPO}
    subprocess.run([sys.executable, "-m", "monarch_cli.main", "serve", "--hosts", "4"], cwd=workdir, env=env,
                   check=True, capture_output=True, timeout=180)
    old = os.getcwd()
    os.chdir(workdir)
    try:
        record, _ = load_live()
        rt = ensure_runtime(record.keys)
        chunk = 100_000
        whole = []
        for h in record.hosts:
            for start in range(0, rows, chunk):
                n = min(chunk, rows - start)
                taken = _message_log(n, h.host_rank * 1000 + start // chunk)
                rt.send(h.addr, TelemetryRows({"_message_log": taken}))
                whole.append(derive_messages(*taken)[0])
        for h in record.hosts:  # pushes are handled in order: a ping after them...
            rt.request(h.addr, lambda port: Ping(port)).get(timeout=120)
        deadline = time.monotonic() + 300
        while True:  # ... and a count that has reached every row says they are all in
            r = query(record, "SELECT count(*) AS n FROM messages", timeout_s=120)
            if r.table.column("n")[0].as_py() >= 4 * rows or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        held = r.table.column("n")[0].as_py()
        ctx = SessionContext()
        ctx.register_record_batches("messages", [whole])
        out = {"hosts": len(record.hosts), "rows_per_host": rows, "rows_held": held}
        for key, sql in (("p99", QUERY), ("simple", QUERY_SIMPLE)):
            times, answer = [], None
            for _ in range(repeat):
                t = time.perf_counter()
                answer = query(record, sql, timeout_s=120)
                times.append(time.perf_counter() - t)
            base = []
            for _ in range(repeat):
                t = time.perf_counter()
                expected = ctx.sql(sql).to_arrow_table()
                base.append(time.perf_counter() - t)
            same = answer.table.column("n").to_pylist() == expected.column("n").to_pylist() and not answer.missing_hosts
            out[key] = {"query_p50_ms": statistics.median(times) * 1e3, "query_max_ms": max(times) * 1e3,
                        "one_table_p50_ms": statistics.median(base) * 1e3,
                        "ratio_vs_one_table": statistics.median(times) / statistics.median(base), "same_answer": same}
        return out
    finally:
        os.chdir(old)
        subprocess.run([sys.executable, "-m", "monarch_cli.main", "stop"], cwd=workdir, env=env, capture_output=True,
                       timeout=120)


# -- recording on vs off ----------------------------------------------------------------------

_CHILD = r"""
import json, statistics, sys, time
from monarch.actor import Actor, endpoint, this_host

class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x

calls = int(sys.argv[1])
procs = this_host().spawn_procs(per_host={"gpus": 1})
a = procs.spawn("echo", Echo)
for i in range(300):
    a.ping.call_one(i).get()
lat = []
for i in range(calls):
    t = time.perf_counter()
    a.ping.call_one(i).get()
    lat.append(time.perf_counter() - t)
t = time.perf_counter()
futs = [a.ping.call_one(i) for i in range(calls)]
for f in futs:
    f.get()
rate = calls / (time.perf_counter() - t)
print(json.dumps({"p50_us": statistics.median(lat) * 1e6, "rate": rate}))
"""


def bench_recording(rounds: int, calls: int) -> dict:
    results: dict[str, list] = {"1": [], "0": []}
    for _ in range(rounds):
        for flag in ("1", "0"):
            env = {**os.environ, "PYTHONPATH": REPO, "MONARCH_TELEMETRY": flag}
            p = subprocess.run([sys.executable, "-c", _CHILD, str(calls)], env=env, capture_output=True, text=True,
                               timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"recording bench child failed:\n{p.stderr[-2000:]}")
            results[flag].append(json.loads(p.stdout.strip().splitlines()[-1]))
    on_lat = statistics.median(r["p50_us"] for r in results["1"])
    off_lat = statistics.median(r["p50_us"] for r in results["0"])
    on_rate = statistics.median(r["rate"] for r in results["1"])
    off_rate = statistics.median(r["rate"] for r in results["0"])
    return {"call_one_p50_us_on": on_lat, "call_one_p50_us_off": off_lat, "latency_ratio_on_off": on_lat / off_lat,
            "throughput_on": on_rate, "throughput_off": off_rate, "throughput_ratio_on_off": on_rate / off_rate}


def bench_hot_path(n: int) -> dict:
    """CPU the recording adds per message, in-process: the client's send row plus the proc's handled row."""
    from monarch_agents import actor_telemetry
    from monarch_agents.messages import Call, PortRef
    from monarch.actor import _telemetry as client_tel
    from monarch.actor._shape import Shape
    from monarch_telemetry import recorder as rmod

    class _Mesh:
        def __init__(self) -> None:
            self._actor_id = "echo-1"
            self._shape = Shape((), (), (0,))

    class _Slot:
        class msg:
            actor_id, name, point, extent = "echo-1", "echo", {}, {}
        info = None

    class _Rt:
        addr = "tcp://127.0.0.1:1#1"

    mesh, slot, rt = _Mesh(), _Slot(), _Rt()
    call = Call("echo-1", "ping", None, {}, {}, PortRef(rt.addr, 5), 0, rt.addr)
    out = {}
    for flag in (True, False):
        rec = rmod.install(rmod.Recorder("h", enabled=flag))
        actor_telemetry.rec = rec
        t = time.perf_counter()
        for _ in range(n):
            client_tel.sent(rt, mesh, "ping", mesh._shape, call.reply)
            actor_telemetry.arrived(call)
            t0 = actor_telemetry.begin()
            actor_telemetry.handled(slot, call, t0, True)
            if rec.buffers["sent_messages"].rows >= 50_000:
                rec.take()
        out["on" if flag else "off"] = (time.perf_counter() - t) / n * 1e6
    def noop() -> None:
        pass

    t = time.perf_counter()
    for _ in range(n):
        noop()
    call = (time.perf_counter() - t) / n * 1e6
    # The machine's speed in the same units: how many empty Python calls the recording costs.
    return {"recording_us_per_message": out["on"] - out["off"], "empty_call_us": call,
            "recording_in_empty_calls": (out["on"] - out["off"]) / call}


# -- memory bound -------------------------------------------------------------------------------


def bench_memory(messages: int, bound_mib: int) -> dict:
    import psutil

    from monarch_telemetry.recorder import Recorder
    from monarch_telemetry.table import Store

    bound = bound_mib << 20
    store = Store(max_bytes=bound)
    rec = Recorder("host0")
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    peak_table = peak_rss = 0
    t = time.perf_counter()
    for i in range(messages):
        rec.message(rec.new_id(), i, i + 5, i + 100, 7, 8, "step", None, True)
        if i % 50_000 == 49_999:
            store.absorb(rec.take())
            peak_table = max(peak_table, store["messages_ext"].nbytes + store["message_status_events_ext"].nbytes)
            peak_rss = max(peak_rss, proc.memory_info().rss)
    store.absorb(rec.take())
    record_s = time.perf_counter() - t
    return {"messages": messages, "bound_bytes_per_table": bound,
            "messages_table_bytes": store["messages_ext"].nbytes,
            "status_events_table_bytes": store["message_status_events_ext"].nbytes,
            "within_bound": store["messages_ext"].nbytes <= bound and store["message_status_events_ext"].nbytes <= bound,
            "rows_kept": store["messages_ext"].num_rows, "rows_dropped": store["messages_ext"].dropped_rows,
            "rss_growth_mib": (peak_rss - rss0) / (1 << 20), "record_ns_per_message": record_s / messages * 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="messages rows per host")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3, help="recording on/off rounds")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--bound-mib", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.repeat, args.rounds, args.calls = 50_000, 3, 1, 300
    out = {}
    with tempfile.TemporaryDirectory(prefix="telemetry-bench-") as d:
        out["query"] = bench_query(args.rows, args.repeat, d)
    out["recording"] = bench_recording(args.rounds, args.calls)
    out["hot_path"] = bench_hot_path(200_000 if not args.quick else 20_000)
    out["memory"] = bench_memory(1_000_000 if not args.quick else 200_000, args.bound_mib)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    q, r, m, h = out["query"], out["recording"], out["memory"], out["hot_path"]
    for key, what in (("p99", "count/avg/approx p99 by endpoint"), ("simple", "count/avg/max by endpoint")):
        x = q[key]
        print(f"query ({what}) over {q['hosts']} hosts x {q['rows_per_host']:,} messages rows ({q['rows_held']:,} held): "
              f"p50 {x['query_p50_ms']:.0f} ms (max {x['query_max_ms']:.0f}); the same SQL over one in-process table "
              f"{x['one_table_p50_ms']:.0f} ms; ratio {x['ratio_vs_one_table']:.2f}x; same answer: {x['same_answer']}")
    print(f"recording CPU per message (client send row + proc handled row): {h['recording_us_per_message']:.2f} us "
          f"= {h['recording_in_empty_calls']:.0f} empty Python calls ({h['empty_call_us'] * 1000:.0f} ns each here)")
    print(f"call_one p50: recording on {r['call_one_p50_us_on']:.0f} us, off {r['call_one_p50_us_off']:.0f} us, "
          f"ratio {r['latency_ratio_on_off']:.3f}")
    print(f"throughput: on {r['throughput_on']:.0f}/s, off {r['throughput_off']:.0f}/s, ratio {r['throughput_ratio_on_off']:.3f}")
    print(f"memory: {m['messages']:,} messages, bound {m['bound_bytes_per_table'] >> 20} MiB per table: messages "
          f"{m['messages_table_bytes'] / 2**20:.1f} MiB, status events {m['status_events_table_bytes'] / 2**20:.1f} MiB "
          f"(within bound: {m['within_bound']}), {m['rows_kept']:,} rows kept, RSS +{m['rss_growth_mib']:.0f} MiB, "
          f"{m['record_ns_per_message']:.0f} ns per recorded message")


if __name__ == "__main__":
    main()
