"""An async actor's ``__supervise__`` runs while one of its endpoints awaits: the endpoint
broadcasts to a child (no caller waits for that answer, so the child's exception fails it) and
then waits until ``__supervise__`` has seen the failure.  Runs unchanged on monarch and on
torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import asyncio

from monarch.actor import Actor, endpoint, this_host


class Child(Actor):
    @endpoint
    async def ready(self) -> bool:
        return True

    @endpoint
    async def explode(self) -> None:
        raise ValueError("child exploded")


class Parent(Actor):
    def __init__(self, procs):
        self.child = procs.spawn("child", Child)
        self.seen: list = []
        self.supervised = asyncio.Event()

    @endpoint
    async def break_child(self) -> list:
        await self.child.ready.call()
        self.child.explode.broadcast()
        await asyncio.wait_for(self.supervised.wait(), timeout=60)
        return self.seen

    def __supervise__(self, failure) -> bool:
        self.seen.append(("child" in str(failure), "child exploded" in failure.report()))
        self.supervised.set()
        return True


parent_procs = this_host().spawn_procs(per_host={"gpus": 1})
child_procs = this_host().spawn_procs(per_host={"gpus": 1})
parent = parent_procs.spawn("parent", Parent, child_procs)
print("supervised while the endpoint waited (names the child, names its exception):",
      parent.break_child.call_one().get()[:1])
parent_procs.stop().get()
child_procs.stop().get()
print("done")
