"""Behaviours of Monarch's actor API that a program can observe; prints what it sees.

Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import asyncio
import pickle
import threading

from monarch.actor import Actor, ActorError, as_endpoint, context, endpoint, this_host


class SyncActor(Actor):
    def __init__(self):
        self.init_thread = threading.get_ident()
        self.init_has_loop = _has_loop()

    @endpoint
    def where(self) -> tuple:
        return self.init_thread == threading.get_ident(), self.init_has_loop, _has_loop()

    @endpoint
    def my_name(self) -> str:
        return context().actor_instance.name

    async def not_an_endpoint_coro(self) -> int:
        return 1

    def not_an_endpoint(self, x: int) -> int:
        return x + 1


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


class Fragile(Actor):
    @endpoint
    def interrupt(self) -> None:
        raise KeyboardInterrupt("stop here")

    @endpoint
    def segfault(self) -> None:
        import ctypes

        ctypes.string_at(0)  # a crash in native code: reads address 0


class Holder(Actor):
    @endpoint
    def shut_down(self, hosts) -> str:
        try:
            hosts.shutdown().get()
            return "shut down"
        except RuntimeError as e:
            return str(e).split(" (")[0]


class Batch(Actor):
    """Stops itself when its work is done (Monarch's Instance.stop)."""

    def __init__(self):
        self.done = 0

    @endpoint
    async def step(self) -> int:
        self.done += 1
        return self.done

    @endpoint
    async def finish(self) -> None:
        context().actor_instance.stop("batch complete")

    async def __cleanup__(self, exc) -> None:
        self.done = -1  # (what it prints would race the client's own lines)


class MismatchedCleanup(Actor):
    @endpoint
    async def step(self) -> None:
        pass

    def __cleanup__(self, exc) -> None:
        pass


class Shadowing(Actor):
    @endpoint
    def stop(self) -> int:
        return 1


procs = this_host().spawn_procs(per_host={"gpus": 1})
actor = procs.spawn("sync_actor", SyncActor)
print("same thread, init loop, endpoint loop:", actor.where.call_one().get())
print("actor name:", actor.my_name.call_one().get())
print("client name:", context().actor_instance.name)
print("as_endpoint plain:", as_endpoint(actor.not_an_endpoint).call_one(41).get())
try:
    as_endpoint(actor.not_an_endpoint_coro).call_one().get()
except ActorError as e:
    print("as_endpoint coroutine:", str(e).strip().splitlines()[-1])
try:
    procs.spawn("shadowing", Shadowing)
except ValueError as e:
    print("shadowing:", str(e).split(", ActorMesh.")[0])


async def observe():
    f = actor.where.call_one()
    a, b = f.as_asyncio(), f.as_asyncio()
    return (await a) == (await b), isinstance(a, asyncio.Future)


print("as_asyncio:", asyncio.run(observe()))
try:
    actor.where.call_one().as_asyncio()
except RuntimeError as e:
    print("as_asyncio off a loop:", type(e).__name__)


def first_lines(call, n: int) -> list:
    try:
        call.get()
    except Exception as e:
        return [type(e).__name__, *str(e).splitlines()[:n]]
    return ["no error"]


print("host mesh sent to an actor:", procs.spawn("holder", Holder).shut_down.call_one(this_host()).get())
try:
    pickle.loads(pickle.dumps(this_host())).shutdown().get()
except RuntimeError as e:
    print("unpickled host mesh:", str(e).split(" (")[0])

import monarch.actor  # noqa: E402

monarch.actor.unhandled_fault_hook = lambda failure: None  # these failures are expected
fragile = procs.spawn("fragile", Fragile)
print("BaseException:", first_lines(fragile.interrupt.call_one(), 1))
doomed = this_host().spawn_procs(per_host={"gpus": 1})
print("SIGSEGV:", first_lines(doomed.spawn("doomed", Fragile).segfault.call_one(), 2))
try:
    procs.spawn("mismatched", MismatchedCleanup)
except ValueError as e:
    print("hook kinds:", str(e).split(". Make sure")[0].replace("__main__.", ""))
batch = this_host().spawn_procs(per_host={"gpus": 1}).spawn("batch", Batch)
steps = [batch.step.call_one() for _ in range(2)]
print("batch steps:", [f.get() for f in steps])
batch.finish.broadcast()  # it stops itself; whether a reply to that very message still arrives is a race
for _ in range(100):  # calls queued before the stop are still handled; after it, they fail
    outcome = first_lines(batch.step.call_one(), 0)
    if outcome != ["no error"]:
        break
print("after its stop:", outcome)
procs.stop().get()
print("done")
