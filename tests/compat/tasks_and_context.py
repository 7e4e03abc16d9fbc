"""Monarch's task API as its programs and tests drive it (``PythonTask``, ``Shared``, a ``Future``
of a coroutine), and the client's context as every thread gets it: one ``_client_context.get()``
per ``context()`` from a thread outside any actor.  Runs unchanged on monarch and on torchmonarch
0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import threading
import time
from unittest.mock import patch

from monarch._rust_bindings.monarch_hyperactor.pytokio import PythonTask, Shared
from monarch._src.actor.actor_mesh import _client_context
from monarch._src.actor.future import Future
from monarch.actor import context


async def add(a: int, b: int) -> int:
    return a + b


print("block_on", PythonTask.from_coroutine(add(2, 3)).block_on())

gate = threading.Event()


async def after_gate() -> str:
    await PythonTask.spawn_blocking(gate.wait)
    return "opened"


shared = PythonTask.from_coroutine(after_gate()).spawn()
print("pending poll", shared.poll())


async def both(s: Shared) -> list:
    return [await s, await s]


watcher = PythonTask.from_coroutine(both(shared)).spawn()
gate.set()
print("shared twice", watcher.block_on(), "poll", shared.poll())
print("from_value", Shared.from_value(7).poll())
print("spawn_blocking", PythonTask.spawn_blocking(lambda: 6 * 7).block_on())


async def nap(s: float) -> float:
    time.sleep(s)
    return s


try:
    PythonTask.from_coroutine(add(1, 1)).spawn().task().with_timeout(5).block_on()
    print("with_timeout in time")
    PythonTask.spawn_blocking(lambda: time.sleep(3)).task().with_timeout(0.1).block_on()
except TimeoutError:
    print("with_timeout TimeoutError")

ran = []


async def noted() -> int:
    ran.append("ran")
    return 11


fut = Future._from_coro(noted())
time.sleep(0.2)
print("future before get", ran)
print("future get", fut.get(), ran)


async def fails() -> None:
    raise ValueError("from the coroutine")


try:
    Future._from_coro(fails()).get()
except ValueError as e:
    print("future raises", e)

context()  # the client's context exists before the threads ask
real_get = _client_context.get
with patch.object(_client_context, "get") as counted:
    counted.side_effect = real_get
    threads = [threading.Thread(target=context) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("client context asked", counted.call_count, "times by 20 threads")
print("same context", context().actor_instance.rank == real_get().actor_instance.rank)
print("done")
