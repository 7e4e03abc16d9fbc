"""Workers on this machine at ``ipc://PATH`` addresses (Unix sockets): the client starts them,
attaches at once, spawns on them and shuts them down.  Usage: python ipc_workers.py DIR.  Runs
unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import os
import subprocess
import sys

from monarch.actor import Actor, attach_to_workers, current_rank, endpoint


class Hello(Actor):
    @endpoint
    def hello(self) -> str:
        return f"hello from host {current_rank()['hosts']}"


addresses = [f"ipc://{os.path.join(sys.argv[1], str(i))}" for i in range(2)]
workers = [subprocess.Popen([sys.executable, "-c", "from monarch.actor import run_worker_loop_forever; "
                             f"run_worker_loop_forever(address={a!r}, ca='trust_all_connections')"])
           for a in addresses]
try:
    hosts = attach_to_workers(ca="trust_all_connections", workers=addresses)
    print(sorted(hosts.spawn_procs().spawn("hello", Hello).hello.call().get().values()))
    hosts.shutdown().get()
    print("shut down")
finally:
    for w in workers:  # a worker loop serves forever: never leave one behind
        w.kill()
        w.wait()
