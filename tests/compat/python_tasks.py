"""Monarch's task objects as its own tests use them: a ``Future`` made from a coroutine
(``Future._from_coro``), ``PythonTask`` (one-shot: ``block_on``, ``spawn``, ``await`` inside
another, ``select_one``, ``with_timeout``, ``spawn_blocking``) and ``Shared`` (waited on again and
again), and ``context()`` being one object for the whole of a message, in the tasks it starts too.
Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import asyncio
import operator
import time

from monarch._rust_bindings.monarch_hyperactor.pytokio import PythonTask, Shared
from monarch._src.actor.future import Future
from monarch.actor import Accumulator, Actor, context, endpoint, this_host


async def value_of(v):
    return v


async def broken():
    raise ValueError("from the coroutine")


print("from_coro get:", Future._from_coro(value_of(3)).get())


async def awaited():
    return await Future._from_coro(value_of(4))


print("from_coro awaited:", asyncio.run(awaited()))
try:
    Future._from_coro(broken()).get()
except ValueError as e:
    print("from_coro raised:", e)


class FakeEndpoint:
    """What Accumulator needs of an endpoint: ``stream`` gives one future per answer."""

    def __init__(self, values):
        self.values = values

    def stream(self, *args, **kwargs):
        return iter([Future._from_coro(value_of(v)) for v in self.values])


print("accumulate:", Accumulator(FakeEndpoint([1, 2, 3]), 0, operator.add).accumulate().get(),
      Accumulator(FakeEndpoint([1, 2, 3]), [], lambda a, r: a + [r]).accumulate().get(),
      Accumulator(FakeEndpoint([]), 42, operator.add).accumulate().get())


async def inner():
    return (7, 2, 3)


async def outer():
    return await PythonTask.from_coroutine(inner())


print("task in a task:", PythonTask.from_coroutine(outer()).block_on())
shared = PythonTask.from_coroutine(inner()).spawn()
print("shared, twice:", shared.block_on(), shared.block_on(), shared.poll())
print("from_value:", Shared.from_value(9).block_on())


def after(t):
    time.sleep(t)
    return t


slow = PythonTask.spawn_blocking(lambda: after(2))
fast = PythonTask.spawn_blocking(lambda: after(0))
print("select_one:", PythonTask.select_one([slow.task(), fast.task()]).block_on())
print("the loser still finishes:", slow.block_on())
try:
    PythonTask.sleep(30).with_timeout(0.2).block_on()
except TimeoutError:
    print("with_timeout: TimeoutError")
print("client context is one object:", context() is context())


class Spawner(Actor):
    @endpoint
    def through_spawn(self) -> bool:
        cx = context()

        async def task():
            return cx is context()

        return PythonTask.from_coroutine(coro=task()).spawn().block_on()

    @endpoint
    def through_spawn_blocking(self) -> bool:
        cx = context()
        return PythonTask.spawn_blocking(lambda: cx is context()).block_on()


procs = this_host().spawn_procs(per_host={"gpus": 1})
s = procs.spawn("spawner", Spawner)
print("context through spawn:", s.through_spawn.call_one().get(), s.through_spawn_blocking.call_one().get())
procs.stop().get()
print("done")
