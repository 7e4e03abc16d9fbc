"""An actor whose ``__init__`` never returns: what it did before blocking takes effect (it spawned
an actor and sent it back through a port), and stopping it returns instead of waiting for ever.
Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import asyncio
import threading

from monarch.actor import Actor, Channel, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start

    @endpoint
    async def value(self) -> int:
        return self.n


class Stuck(Actor):
    def __init__(self, procs, send):
        send.send(procs.spawn("counter", Counter, 42))
        threading.Event().wait()  # never returns

    @endpoint
    async def never_answered(self) -> None:
        pass


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    send, recv = Channel.open()
    stuck = procs.spawn("stuck", Stuck, procs, send)
    counter = await asyncio.wait_for(recv.recv(), 60)
    print("spawned from the blocked __init__:", await counter.value.call_one())
    await asyncio.wait_for(stuck.stop(), 60)
    print("stopping it returned")
    await procs.stop()
    print("done")


asyncio.run(main())
