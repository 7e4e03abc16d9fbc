#!/usr/bin/env python
"""Bytes between hosts: what the cipher and the link allow, beside what monarch moves, in one run.

    .venv/bin/python benchmarks/link_bench.py [--mib 64] [--reps 3] [--json]     # root (network namespaces)

Measures, with the load average beside each figure:

1. one core of libsodium's ``crypto_box_afternm`` / ``crypto_box_open_afternm`` (XSalsa20-Poly1305,
   what ZeroMQ's CURVE seals every message with), on ``--mib`` MiB: MB/s of CPU time and of wall time;
2. a veth pair between two network namespaces: one TCP stream, ``sendall``/``recv_into`` of 4 MiB
   buffers for 2 s (MB/s; the kernel's copy and the veth, the floor of any transport);
3. ZeroMQ PUSH -> PULL of ``--mib`` MiB messages over that veth, plain and with CURVE (the cipher on
   both ends in libzmq's I/O threads);
4. monarch's ``--mib`` MiB bytes echo (``call_one(data).get()``) between this host and a host served
   in its own network namespace (``monarch serve --hosts 1 --netns``: TCP + CURVE, as between
   machines), MB/s = payload / round trip, so each direction moves twice that rate: first with
   big buffers through the CURVE connection (``MONARCH_BULK_STREAMS=0``, the baseline), then with
   the bulk streams (``monarch_agents/bulk.py``: AEAD-sealed chunks over parallel TCP streams).

The lower of (1) and (2) is the limit a single stream can reach here; the ratios say how close
each layer comes.  Every namespace and the reservation are removed at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MiB = 1 << 20


def load() -> float:
    return round(os.getloadavg()[0], 2)


# -- 1. the cipher --------------------------------------------------------------------------------


def sodium() -> ctypes.CDLL:
    import zmq

    bundled = glob.glob(os.path.join(os.path.dirname(zmq.__file__), "..", "pyzmq.libs", "libsodium*"))
    lib = ctypes.CDLL(bundled[0] if bundled else "libsodium.so.23")  # the one ZeroMQ links, else the system's
    if lib.sodium_init() < 0:
        raise RuntimeError("sodium_init failed")
    return lib


def cipher_rate(mib: int, reps: int) -> dict:
    lib = sodium()
    n = mib * MiB
    zero = 32  # crypto_box_ZEROBYTES: the plaintext's zero prefix
    m = ctypes.create_string_buffer(n + zero)
    c = ctypes.create_string_buffer(n + zero)
    k, nonce, pk, sk = (ctypes.create_string_buffer(s) for s in (32, 24, 32, 32))
    lib.crypto_box_keypair(pk, sk)
    lib.crypto_box_beforenm(k, pk, sk)
    out = {}
    for name, fn in (("encrypt", lambda: lib.crypto_box_afternm(c, m, ctypes.c_ulonglong(n + zero), nonce, k)),
                     ("decrypt", lambda: lib.crypto_box_open_afternm(m, c, ctypes.c_ulonglong(n + zero), nonce, k))):
        cpu, wall = [], []
        for _ in range(reps):
            c0, w0 = time.thread_time(), time.perf_counter()
            rc = fn()
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - w0)
            if rc != 0:
                raise RuntimeError(f"crypto_box {name} failed")
        out[f"{name}_cpu_MBps"] = round(n / min(cpu) / 1e6)
        out[f"{name}_wall_MBps"] = round(n / statistics.median(wall) / 1e6)
    out["load"] = load()
    return out


# -- 2/3. a veth pair -----------------------------------------------------------------------------


class VethPair:
    """Two network namespaces joined by a veth pair (10.252.<x>.1 and .2); removed by close()."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.a, self.b = f"lb-a-{tag}", f"lb-b-{tag}"
        x = os.getpid() % 250 + 1
        self.ip_a, self.ip_b = f"10.252.{x}.1", f"10.252.{x}.2"
        cmds = [f"ip netns add {self.a}", f"ip netns add {self.b}",
                f"ip link add lba{tag} type veth peer name lbb{tag}",
                f"ip link set lba{tag} netns {self.a}", f"ip link set lbb{tag} netns {self.b}",
                f"ip -n {self.a} addr add {self.ip_a}/24 dev lba{tag}", f"ip -n {self.b} addr add {self.ip_b}/24 dev lbb{tag}",
                f"ip -n {self.a} link set lba{tag} up", f"ip -n {self.b} link set lbb{tag} up",
                f"ip -n {self.a} link set lo up", f"ip -n {self.b} link set lo up"]
        try:
            for c in cmds:
                subprocess.run(c.split(), check=True, capture_output=True)
        except subprocess.CalledProcessError as e:
            self.close()
            raise RuntimeError(f"{' '.join(e.cmd)}: {e.stderr.decode().strip()}") from None

    def close(self) -> None:
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


TCP_RX = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5601)); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); mv = memoryview(bytearray(4 << 20))
while c.recv_into(mv): pass
"""
TCP_TX = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5601)); data = memoryview(bytearray(4 << 20)); n = 0
t0 = time.perf_counter()
while time.perf_counter() - t0 < 2: s.sendall(data); n += len(data)
print(n / (time.perf_counter() - t0) / 1e6, flush=True)
"""
ZMQ_RX = """
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PULL); s.rcvhwm = 4
if sys.argv[2] == "curve":
    s.curve_server = True; s.curve_secretkey = sys.stdin.readline().strip().encode()
s.bind(f"tcp://{sys.argv[1]}:5602"); print("listening", flush=True)
while len(s.recv(copy=False).buffer) > 1: pass
"""
ZMQ_TX = """
import os, sys, time, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PUSH)
if sys.argv[2] == "curve":
    s.curve_serverkey = sys.stdin.readline().strip().encode()
    s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
s.connect(f"tcp://{sys.argv[1]}:5602")
data = os.urandom(int(sys.argv[3]) << 20); reps = int(sys.argv[4])
s.send(data)  # connected and warm
t0 = time.perf_counter()
for _ in range(reps): s.send(data, copy=False)
s.send(b"x"); s.close(linger=-1); ctx.term()
print(len(data) * reps / (time.perf_counter() - t0) / 1e6, flush=True)
"""


def _pair(v: VethPair, rx: str, tx: str, args: list[str], stdin: tuple[str, str] | None = None) -> float:
    r = subprocess.Popen(["ip", "netns", "exec", v.b, sys.executable, "-c", textwrap.dedent(rx), v.ip_b, *args],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if stdin:
            r.stdin.write(stdin[0] + "\n")
            r.stdin.flush()
        assert r.stdout.readline().strip() == "listening"
        t = subprocess.run(["ip", "netns", "exec", v.a, sys.executable, "-c", textwrap.dedent(tx), v.ip_b, *args],
                           input=(stdin[1] + "\n") if stdin else "", capture_output=True, text=True, timeout=300)
        if t.returncode != 0:
            raise RuntimeError(t.stderr.strip()[-500:])
        return float(t.stdout.strip())
    finally:
        try:
            r.wait(timeout=30)  # it ends at the sender's last message (or EOF)
        except subprocess.TimeoutExpired:
            r.kill()
            r.wait()


def link_rates(mib: int, reps: int) -> dict:
    import zmq

    v = VethPair()
    try:
        samples = [_pair(v, TCP_RX, TCP_TX, []) for _ in range(reps)]
        out = {"veth_tcp_MBps": round(statistics.median(samples)), "veth_samples": [round(x) for x in samples],
               "load_veth": load()}
        pk, sk = zmq.curve_keypair()
        plain, curve = [], []
        for _ in range(reps):  # interleaved: both see the same load
            plain.append(_pair(v, ZMQ_RX, ZMQ_TX, ["plain", str(mib), "4"]))
            curve.append(_pair(v, ZMQ_RX, ZMQ_TX, ["curve", str(mib), "4"], (sk.decode(), pk.decode())))
        out.update(zmq_plain_MBps=round(statistics.median(plain)), zmq_curve_MBps=round(statistics.median(curve)),
                   load_zmq=load())
        return out
    finally:
        v.close()


# -- 4. monarch's echo between hosts --------------------------------------------------------------

ECHO = """
import os, sys, time
from monarch.actor import Actor, endpoint
from monarch.job import job_load
class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x
procs = job_load(sys.argv[1]).state().hosts.spawn_procs(per_host={"gpus": 1})
a = procs.spawn("echo", Echo)
data = os.urandom(int(sys.argv[2]) << 20)
a.echo.call_one(data).get(timeout=600)
ts = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter(); r = a.echo.call_one(data).get(timeout=600); ts.append(time.perf_counter() - t0)
    assert len(r) == len(data)
print(len(data) / sorted(ts)[len(ts) // 2] / 1e6, flush=True)
procs.stop().get(timeout=60)
"""


def echo_rate(mib: int, reps: int, streams: str | None = None) -> dict:
    """The echo's rate; ``streams``: MONARCH_BULK_STREAMS for the host agent, its procs and the client
    ("0": big buffers go through CURVE as before the bulk path; None: the default)."""
    cli = [sys.executable, "-m", "monarch_cli.main"]
    env = {**os.environ, "PYTHONPATH": REPO}
    if streams is not None:
        env["MONARCH_BULK_STREAMS"] = streams
    d = tempfile.mkdtemp(prefix="link_bench_")
    try:
        r = subprocess.run([*cli, "serve", "--hosts", "1", "--netns"], cwd=d, env=env, capture_output=True, text=True,
                           timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"monarch serve --netns: {r.stderr.strip()[-300:]}")
        try:
            p = subprocess.run([sys.executable, "-c", ECHO, os.path.join(d, ".monarch", "job_state.pkl"), str(mib),
                                str(reps)], cwd=d, env=env, capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                raise RuntimeError(p.stderr.strip()[-500:])
            return {"echo_MBps": round(float(p.stdout.strip().splitlines()[-1])), "load_echo": load()}
        finally:
            subprocess.run([*cli, "stop"], cwd=d, env=env, capture_output=True, timeout=120)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="message size (MiB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        sys.exit("link_bench needs root and iproute2 (network namespaces)")
    res: dict = {"mib": args.mib, "cpus": os.cpu_count(), "load_start": load()}
    res["cipher"] = cipher_rate(args.mib, args.reps)
    res["link"] = link_rates(args.mib, args.reps)
    res["monarch_curve_only"] = echo_rate(args.mib, args.reps, "0")
    res["monarch"] = echo_rate(args.mib, args.reps)
    # The link again after the echoes: on a shared machine the load moves within a minute, and the
    # limit is the median of the link's rate before and after what is compared with it.
    v = VethPair()
    try:
        res["link"]["veth_samples"] += [round(_pair(v, TCP_RX, TCP_TX, [])) for _ in range(args.reps)]
    finally:
        v.close()
    res["link"]["veth_tcp_MBps"] = round(statistics.median(res["link"]["veth_samples"]))
    c, lk, mo, base = res["cipher"], res["link"], res["monarch"], res["monarch_curve_only"]
    limit = min(c["encrypt_cpu_MBps"], c["decrypt_cpu_MBps"], lk["veth_tcp_MBps"])
    res["limit_MBps"] = limit
    # An echo moves the payload both ways, one after the other: each direction ran at 2x the echo rate.
    res["ratios"] = {"zmq_plain / veth": round(lk["zmq_plain_MBps"] / lk["veth_tcp_MBps"], 3),
                     "zmq_curve / limit": round(lk["zmq_curve_MBps"] / limit, 3),
                     "monarch echo, CURVE only (per direction) / limit": round(2 * base["echo_MBps"] / limit, 3),
                     "monarch echo (per direction) / limit": round(2 * mo["echo_MBps"] / limit, 3)}
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{args.mib} MiB messages, {os.cpu_count()} cpus, load average {res['load_start']} at start")
    print(f"libsodium crypto_box (CURVE's cipher), one core: encrypt {c['encrypt_cpu_MBps']} MB/s of CPU "
          f"({c['encrypt_wall_MBps']} wall), decrypt {c['decrypt_cpu_MBps']} ({c['decrypt_wall_MBps']} wall)   load {c['load']}")
    print(f"veth pair, one TCP stream: {lk['veth_tcp_MBps']} MB/s (median of {lk['veth_samples']}, before and after "
          f"the echoes)   load {lk['load_veth']}")
    print(f"zmq PUSH/PULL over it: plain {lk['zmq_plain_MBps']} MB/s, CURVE {lk['zmq_curve_MBps']} MB/s   load {lk['load_zmq']}")
    print(f"monarch bytes echo to a --netns host, big buffers through CURVE (MONARCH_BULK_STREAMS=0, before): "
          f"{base['echo_MBps']} MB/s a round trip ({2 * base['echo_MBps']} MB/s each way)   load {base['load_echo']}")
    print(f"monarch bytes echo to a --netns host, bulk streams: {mo['echo_MBps']} MB/s a round trip "
          f"({2 * mo['echo_MBps']} MB/s each way)   load {mo['load_echo']}")
    print(f"limit (lower of one core's cipher and the veth): {limit} MB/s;  " +
          ";  ".join(f"{k} {v}" for k, v in res["ratios"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
