"""Monarch's worker bootstrap: two workers wait at their addresses, the client attaches to them.

Each worker is a process running ``run_worker_loop_until_shutdown`` (so it returns, exit 0, once
the client shuts the host mesh down).  Usage: python workers.py PORT0 PORT1
"""

import subprocess
import sys
import time

from monarch.actor import Actor, attach_to_workers, current_rank, endpoint


class Where(Actor):
    @endpoint
    def where(self) -> str:
        import os

        return f"{current_rank()['hosts']}/{current_rank()['gpus']} {os.environ.get('MONARCH_HOST_RANK')}"


addresses = [f"tcp://127.0.0.1:{p}" for p in sys.argv[1:3]]
workers = [subprocess.Popen([sys.executable, "-c", "from monarch.actor import run_worker_loop_until_shutdown; "
                             f"run_worker_loop_until_shutdown(ca='trust_all_connections', address={a!r})"])
           for a in addresses]

try:
    # A worker may still be binding its address: try until it answers (as Monarch's client waits).
    for _ in range(600):
        try:
            hosts = attach_to_workers(ca="trust_all_connections", workers=addresses)
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    print(hosts.extent)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    print(sorted(procs.spawn("where", Where).where.call().get().values()))
    hosts.shutdown().get()
    print("workers exited", [w.wait(timeout=60) for w in workers])
finally:
    for w in workers:  # a worker loop serves forever: never leave one behind
        if w.poll() is None:
            w.kill()
            w.wait()
