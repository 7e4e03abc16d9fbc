"""Attaching to workers that are still starting: the client attaches right after starting them
(one listens on the wildcard address and advertises loopback, ``tcp://ADVERTISE:PORT@tcp://BIND:PORT``)
and its attach waits for them.  Usage: python workers_starting.py PORT0 PORT1.  Runs unchanged on
monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import subprocess
import sys

from monarch.actor import Actor, attach_to_workers, current_rank, endpoint


class Rank(Actor):
    @endpoint
    def rank(self) -> int:
        return current_rank()["hosts"]


p0, p1 = sys.argv[1:3]
addresses = [f"tcp://127.0.0.1:{p0}", f"tcp://127.0.0.1:{p1}@tcp://0.0.0.0:{p1}"]
workers = [subprocess.Popen([sys.executable, "-c", "from monarch.actor import run_worker_loop_forever; "
                             f"run_worker_loop_forever(address={a!r}, ca='trust_all_connections')"])
           for a in addresses]
try:
    hosts = attach_to_workers(ca="trust_all_connections", workers=addresses)
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    print("ranks:", sorted(procs.spawn("rank", Rank).rank.call().get().values()))
    hosts.shutdown().get()
    print("shut down")
finally:
    for w in workers:  # a worker loop serves forever: never leave one behind
        w.kill()
        w.wait()
