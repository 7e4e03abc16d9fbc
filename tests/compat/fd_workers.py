"""A worker that listens on a socket its parent bound and passed down (``tcp://HOST:fdN``); the
client attaches at the port, and its ``shutdown()`` ends the workers' loops (they exit 0).  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import socket
import subprocess
import sys

from monarch.actor import Actor, attach_to_workers, endpoint


class Hello(Actor):
    @endpoint
    def hello(self) -> str:
        return "hello"


workers, addresses = [], []
for _ in range(2):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    fd = sock.fileno()
    workers.append(subprocess.Popen([sys.executable, "-c", "from monarch.actor import run_worker_loop_forever; "
                                     f"run_worker_loop_forever(address='tcp://127.0.0.1:fd{fd}', "
                                     "ca='trust_all_connections')"], pass_fds=(fd,)))
    addresses.append(f"tcp://127.0.0.1:{sock.getsockname()[1]}")
    sock.close()
try:
    hosts = attach_to_workers(ca="trust_all_connections", workers=addresses)
    print(list(hosts.spawn_procs().spawn("hello", Hello).hello.call().get().values()))
    hosts.shutdown().get()
    print("shut down")
    print("worker exits:", [w.wait(timeout=30) for w in workers])
finally:
    for w in workers:  # a worker loop left running is never left behind
        w.kill()
        w.wait()
