"""Monarch's debugger actor, driven by a program: it makes the job's ``debug_controller`` (a subclass of
``DebugController`` whose ``DebugIO`` is a script, not a terminal), then ``breakpoint()`` in each rank
of an actor stops there.  The controller lists the stopped ranks (where each stands), attaches to
one to step and print a variable, sends a command to another with ``cast``, and ``continue`` lets
them all go.  A rank whose endpoint
then raises is held in a post-mortem session first, at the line that raised, and its caller gets the
error once that session is continued.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_refs_compat.py compares them).
"""

import asyncio
import os

os.environ["MONARCH_DEBUG_SERVER_PORT"] = "0"  # torchmonarch's controller listens there: any free port

from monarch._src.actor.debugger.debug_controller import DebugController  # noqa: E402
from monarch._src.actor.debugger.debug_io import DebugIO  # noqa: E402
from monarch.actor import Actor, concurrent_endpoint, context, current_rank, endpoint  # noqa: E402
from monarch.actor import get_or_spawn_controller, this_host  # noqa: E402



class ScriptIO(DebugIO):
    def __init__(self) -> None:
        self.script: list = []
        self.shown: list = []

    async def input(self, prompt: str = "") -> str:
        return self.script.pop(0)

    async def output(self, msg: str) -> None:
        self.shown.append(msg)

    async def quit(self) -> None:
        pass


class Console(DebugController):
    def __init__(self) -> None:
        super().__init__()
        self._debug_io = ScriptIO()

    @concurrent_endpoint
    async def run_script(self, lines: list) -> None:
        self._debug_io.script[:] = lines
        async with self._task_lock:
            await self._enter()

    @endpoint
    async def shown(self) -> list:
        return list(self._debug_io.shown)


def accumulate(rank: int) -> int:
    total = 10 * rank
    breakpoint()  # noqa: T100
    total += 1
    total += 2
    if rank == 2:
        raise ValueError(f"rank {rank} gives up at {total}")
    return total


class Walker(Actor):
    @endpoint
    async def walk(self) -> int:
        return accumulate(current_rank().rank)

    @endpoint
    async def name(self) -> str:
        return context().actor_instance.actor_id.actor_name


def stopped(controller, n: int, moved_to: int | None = None) -> list:
    """The sessions once there are ``n``, each placed (a session's place is known once its pdb wrote
    there), with ``moved_to``, the last that many lines past the breakpoint."""
    for _ in range(600):
        infos = controller.list.call_one(print_output=False).get()
        placed = all(i.lineno is not None for i in infos)
        if len(infos) == n and placed and (moved_to is None or infos[-1].lineno - first == moved_to):
            return infos
        asyncio.run(asyncio.sleep(0.1))
    raise RuntimeError(f"{n} ranks never stopped" + (f" {moved_to} lines on" if moved_to else ""))


controller = get_or_spawn_controller("debug_controller", Console).get()
walkers = this_host().spawn_procs(per_host={"gpus": 3}).spawn("walker", Walker)
name = walkers.slice(gpus=0).name.call_one().get()
answers = walkers.walk.call()
controller.wait_pending_session.call_one().get()
first = 0
infos = stopped(controller, 3)
first = infos[0].lineno
print("stopped:", [(i.actor_name == name, i.rank, i.function.endswith(".accumulate"), i.lineno - first) for i in infos])

controller.run_script.call_one([f"attach {name} 0", "n", "p total", "detach", f"cast {name} ranks(1) n",
                                f"attach {name} 1", "p total", "detach", "quit"]).get()
print("printed by ranks 0 and 1:", [s.strip() for s in controller.shown.call_one().get() if s.strip() in ("1", "11")])
print("after stepping:", [(i.rank, i.lineno - first) for i in controller.list.call_one(print_output=False).get()])

controller.run_script.call_one(["continue", "quit"]).get()
infos = stopped(controller, 1, moved_to=3)  # where it raised
print("post-mortem:", [(i.rank, i.function.endswith(".accumulate"), i.lineno - first) for i in infos])
controller.run_script.call_one([f"attach {name} 2", "p total", "c", "quit"]).get()
print("post-mortem printed:", [s.strip() for s in controller.shown.call_one().get() if s.strip() == "23"])
stopped(controller, 0)
try:
    answers.get()
except Exception as e:
    print("caller sees:", type(e).__name__, "rank 2 gives up at 23" in str(e))
print("done")
