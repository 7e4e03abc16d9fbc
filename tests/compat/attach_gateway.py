"""A client that reaches its worker only through one worker loop's address (Monarch's ``attach``):
it attaches before anything else, attaches a host mesh of that worker, and then the worker's
socket file is removed, so nothing can dial the address again; spawning and calling there, on
this machine's own procs, and from a proc there back to one here all still work.  Usage: python
attach_gateway.py DIR.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import os
import subprocess
import sys
import time

from monarch._src.actor.actor_mesh import attach
from monarch.actor import Actor, attach_to_workers, endpoint, this_host


class Echo(Actor):
    @endpoint
    def echo(self, msg: str) -> str:
        return msg


class Relay(Actor):
    def __init__(self, target) -> None:
        self.target = target

    @endpoint
    async def relay(self, msg: str) -> str:
        return await self.target.echo.call_one(msg)


path = os.path.join(sys.argv[1], "worker")
address = f"ipc://{path}"
worker = subprocess.Popen([sys.executable, "-c", "from monarch.actor import run_worker_loop_forever; "
                           f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')"],
                          start_new_session=True)
try:
    for _ in range(600):
        if os.path.exists(path):
            break
        time.sleep(0.05)
    attach(address)
    attach(address)  # the same address again: nothing to do
    try:
        attach(address + "-elsewhere")
    except RuntimeError as e:
        print("another address:", "already attached" in str(e))
    hosts = attach_to_workers(ca="trust_all_connections", workers=[address])
    hosts.initialized.get()
    os.remove(path)  # from here on the client must not need the worker's address
    remote = hosts.spawn_procs(per_host={"procs": 2}).spawn("echo", Echo)
    print("remote:", sorted(remote.echo.call("hello").get().values()))
    local = this_host().spawn_procs(per_host={"procs": 1}).spawn("local_echo", Echo)
    print("local:", local.echo.call_one("from the client").get())
    relay = hosts.spawn_procs(per_host={"relay": 1}).spawn("relay", Relay, local)
    print("remote to local:", relay.relay.call_one("through the worker").get())
finally:
    worker.kill()  # a worker loop serves forever: never leave one behind
    worker.wait()
print("done")
