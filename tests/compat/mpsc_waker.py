"""Monarch's in-process waiting primitives, as its ``_monarch`` tests use them: an ``Event`` set by a
waker from another thread and awaited on one loop (``monarch._src.actor.waker.PyTestWaker``), and a
channel whose sender may be on any thread (``pympsc.channel_for_test``).  Runs unchanged on monarch
and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them)."""

import asyncio
import threading

import monarch._src.actor.mpsc  # noqa: F401 - Monarch's tests import it first (it completes Receiver)
from monarch._rust_bindings.monarch_hyperactor.pympsc import channel_for_test
from monarch._src.actor.mpsc import Receiver
from monarch._src.actor.waker import PyTestWaker


async def events() -> None:
    waker, event = PyTestWaker.create()
    print("woken before any wait:", waker.wake())
    print("wait sees it:", await asyncio.wait_for(event.wait(), 30))
    print("still set:", await asyncio.wait_for(event.wait(), 30))
    event.clear()
    threading.Timer(0.05, waker.wake).start()
    print("woken from a thread:", await asyncio.wait_for(event.wait(), 30))
    event.clear()
    waker.wake()
    event.clear()  # the wake is delivered in the loop's turn, after this
    print("a wake is not lost to a clear:", await asyncio.wait_for(event.wait(), 30))

    def other_loop() -> None:
        try:
            asyncio.run(event.wait())
        except RuntimeError as e:
            print("other loop:", type(e).__name__)

    t = threading.Thread(target=other_loop)
    t.start()
    t.join()


async def channel() -> None:
    tx, rx = channel_for_test()
    print("empty:", rx.try_recv())
    for i in (1, 2, 3):
        tx.send(i)
    print("in order:", [await rx.recv() for _ in range(3)])
    threading.Thread(target=lambda: [tx.send(i) for i in range(10, 15)]).start()
    print("from a thread:", [await asyncio.wait_for(rx.recv(), 30) for _ in range(5)])


print("Receiver[int] is Receiver:", Receiver[int] is Receiver)
asyncio.run(events())
asyncio.run(channel())
print("done")
