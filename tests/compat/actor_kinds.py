"""Which actors run on an event loop: an actor with async endpoints, or with no endpoints at all,
is an async actor (its ``__init__`` runs on its loop and may start tasks there; its async
``__cleanup__`` is awaited); one with ``def`` endpoints has no loop.  Runs unchanged on monarch and
on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import asyncio

from monarch.actor import Actor, endpoint, this_host


def loop_running() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


class Notes(Actor):
    def __init__(self):
        self.notes: list = []

    @endpoint
    def note(self, what: str, value) -> None:
        self.notes.append((what, value))

    @endpoint
    def read(self) -> list:
        return sorted(self.notes)


class Quiet(Actor):
    """No endpoints: it only reports, from its __init__ and its __cleanup__."""

    def __init__(self, notes):
        self.notes = notes
        self.notes.note.broadcast("quiet: __init__ on a loop", loop_running())

    async def __cleanup__(self, exc) -> None:
        await asyncio.sleep(0)
        self.notes.note.broadcast("quiet: async __cleanup__ awaited", True)


class Ticker(Actor):
    def __init__(self):
        self.on_loop = loop_running()
        self.ticks = 0
        if self.on_loop:
            self.task = asyncio.get_running_loop().create_task(self.tick())

    async def tick(self) -> None:
        self.ticks += 1

    @endpoint
    async def seen(self) -> tuple:
        await asyncio.sleep(0.1)
        return self.on_loop, self.ticks


class Plain(Actor):
    def __init__(self):
        self.on_loop = loop_running()

    @endpoint
    def seen(self) -> bool:
        return self.on_loop


procs = this_host().spawn_procs(per_host={"gpus": 1})
notes = procs.spawn("notes", Notes)
quiet = procs.spawn("quiet", Quiet, notes)
quiet.initialized.get()
quiet.stop().get()
print("async endpoints: __init__ on a loop, a task it started ran:", procs.spawn("ticker", Ticker).seen.call_one().get())
print("def endpoints: __init__ on a loop:", procs.spawn("plain", Plain).seen.call_one().get())
for what, value in notes.read.call_one().get():
    print(what, value)
procs.stop().get()
print("done")
