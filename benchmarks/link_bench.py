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
    out.update(aead_rate(mib, reps))
    out["load"] = load()
    return out


def aead_rate(mib: int, reps: int) -> dict:
    """One core of the AEAD the bulk streams seal 1 MiB chunks with (monarch_agents/bulk.py), MB/s of CPU."""
    sys.path.insert(0, REPO)
    from monarch_agents import bulk

    s = bulk.sodium()
    if s is None:
        return {}
    enc, dec = s.ciphers[s.preferred]
    chunk = bulk.CHUNK
    m, c, tag = bytearray(chunk), bytearray(chunk), bytearray(16)
    ma, ca, ta = s.address(m), s.address(c), s.address(tag)
    key, nonce = os.urandom(32), bytes(12)
    out = {"aead": {bulk.CIPHER_AES256GCM: "AES-256-GCM", bulk.CIPHER_CHACHA20POLY1305: "ChaCha20-Poly1305"}[s.preferred]}
    enc(ca, ta, None, ma, chunk, None, 0, None, nonce, key)
    n = max(1, mib)
    for name, fn in (("encrypt", lambda: enc(ca, ta, None, ma, chunk, None, 0, None, nonce, key)),
                     ("decrypt", lambda: dec(ma, None, ca, chunk, ta, None, 0, nonce, key))):
        cpu = []
        for _ in range(reps):
            c0 = time.thread_time()
            for _ in range(n):
                if fn() != 0:
                    raise RuntimeError(f"AEAD {name} failed")
            cpu.append(time.thread_time() - c0)
        out[f"aead_{name}_cpu_MBps"] = round(n * chunk / min(cpu) / 1e6)
    return out


def on_paper(res: dict, link_MBps: float = 12_500.0) -> dict:
    """What a 100 Gb/s link (12,500 MB/s) would take, from this run's per-core figures."""
    c, lk = res["cipher"], res["link"]
    out = {"link_MBps": link_MBps,
           # libzmq's CURVE runs in one I/O thread per connection: its rate does not grow with the link.
           "curve_share_of_link": round(lk["zmq_curve_MBps"] / link_MBps, 4)}
    if "aead_encrypt_cpu_MBps" in c:
        # One bulk stream's thread seals then writes (its end's share of the kernel's TCP work), so its
        # rate is 1/(1/seal + 1/copy); enough streams to fill the link, and the cores their work takes.
        # The kernel's TCP work (the copies, both ends, and the veth) in MB per CPU-second, measured.
        tcp = lk.get("veth_MB_per_cpu_s") or lk["veth_tcp_MBps"]
        per_stream = 1 / (1 / c["aead_encrypt_cpu_MBps"] + 2 / tcp)  # one end's half of that work
        out.update(seal_cores=round(link_MBps / c["aead_encrypt_cpu_MBps"], 1),
                   open_cores=round(link_MBps / c["aead_decrypt_cpu_MBps"], 1),
                   tcp_cores_both_ends=round(link_MBps / tcp, 1),
                   streams=-(-int(link_MBps) // int(per_stream)))
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
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5601)); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); mv = memoryview(bytearray(4 << 20))
while c.recv_into(mv): pass
print(time.process_time(), flush=True)  # user + system CPU of the receiving end (its copies)
"""
TCP_TX = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5601)); data = memoryview(bytearray(4 << 20)); n = 0
t0 = time.perf_counter()
c0 = time.process_time()
while time.perf_counter() - t0 < 2: s.sendall(data); n += len(data)
print(n / (time.perf_counter() - t0) / 1e6, n, time.process_time() - c0, flush=True)
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


def _pair(v: VethPair, rx: str, tx: str, args: list[str], stdin: tuple[str, str] | None = None,
          cpu: list[float] | None = None) -> float:
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
        out = t.stdout.split()
        if cpu is not None and len(out) == 3:
            rx_cpu = float(r.communicate(timeout=30)[0].split()[-1])
            cpu.append(int(out[1]) / (float(out[2]) + rx_cpu) / 1e6)  # MB per CPU-second, both ends' copies
        return float(out[0])
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
        cpu: list[float] = []
        samples = [_pair(v, TCP_RX, TCP_TX, [], cpu=cpu) for _ in range(reps)]
        out = {"veth_tcp_MBps": round(statistics.median(samples)), "veth_samples": [round(x) for x in samples],
               "veth_MB_per_cpu_s": round(statistics.median(cpu)) if cpu else 0, "load_veth": load()}
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
    res["on_paper_100Gbps"] = on_paper(res)
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
    pp = res["on_paper_100Gbps"]
    if "aead" in c:
        print(f"bulk streams' AEAD ({c['aead']}), one core: seal {c['aead_encrypt_cpu_MBps']} MB/s of CPU, "
              f"open {c['aead_decrypt_cpu_MBps']}")
    line = (f"on paper, a 100 Gb/s link ({pp['link_MBps']:.0f} MB/s): libzmq's CURVE, one I/O thread per connection, "
            f"would fill {100 * pp['curve_share_of_link']:.1f}% of it")
    if "streams" in pp:
        line += (f"; the bulk streams need {pp['seal_cores']} cores sealing on the sender, {pp['open_cores']} opening "
                 f"on the receiver, and {pp['tcp_cores_both_ends']} for the kernel's TCP work at both ends "
                 f"({lk['veth_MB_per_cpu_s']} MB per CPU-second over the veth here), over at least {pp['streams']} streams "
                 f"(MONARCH_BULK_STREAMS; 2 by default)")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
