"""Code the workers have no file for (a notebook cell: compiled under a made-up file name and put in
the client's ``linecache``, as IPython does) is sent to an actor by value and stops at a
``breakpoint()`` in Monarch's debugger actor: pdb there shows and lists the cell's lines, taken from
the client, and a breakpoint set by that file name stops the same call further on.  This is
Monarch's current behaviour (its source's ``RemoteImportLoader``; Meta's
``test_debug_with_pickle_by_value``); torchmonarch 0.7.0 names such code ``<dynamic-code>`` and
shows no lines, so tests/compat/test_refs_compat.py runs this one on monarch only."""

import asyncio
import linecache
import os
import uuid

os.environ["MONARCH_DEBUG_SERVER_PORT"] = "0"  # torchmonarch's controller listens there: any free port

from monarch._src.actor.debugger.debug_controller import DebugController  # noqa: E402
from monarch._src.actor.debugger.debug_io import DebugIO  # noqa: E402
from monarch.actor import Actor, concurrent_endpoint, endpoint, get_or_spawn_controller, this_host  # noqa: E402

CELL = """def triple_plus(x):
    y = x * 3
    breakpoint()
    z = y + 1
    return double(z)


def double(x):
    w = x * 2
    return w
"""
CELL_FILE = f"/nonexistent-{uuid.uuid4().hex}/cell_7.py"
linecache.cache[CELL_FILE] = (len(CELL), None, CELL.splitlines(keepends=True), CELL_FILE)
cell = {"__name__": "cell_7"}
exec(compile(CELL, CELL_FILE, "exec"), cell)


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
    async def run_script(self, lines: list) -> list:
        self._debug_io.script[:] = lines
        self._debug_io.shown.clear()
        async with self._task_lock:
            await self._enter()
        return list(self._debug_io.shown)


class Runner(Actor):
    @endpoint
    def run(self, fn, x: int) -> int:
        return fn(x)


def sessions(controller, n: int, function: str = "") -> list:
    """The sessions once there are ``n``, each placed, the last in ``function``."""
    for _ in range(600):
        infos = controller.list.call_one(print_output=False).get()
        if len(infos) == n and all(i.lineno is not None for i in infos) and \
                (n == 0 or infos[-1].function.endswith(function)):
            return infos
        asyncio.run(asyncio.sleep(0.1))
    raise RuntimeError(f"{n} sessions never came")


controller = get_or_spawn_controller("debug_controller", Console).get()
runner = this_host().spawn_procs(per_host={"gpus": 1}).spawn("runner", Runner)

answer = runner.run.call_one(cell["triple_plus"], 4)
[info] = sessions(controller, 1)
print("stopped in:", info.function.endswith("triple_plus"), info.lineno)
shown = controller.run_script.call_one(["attach runner 0", "l 1,5", "p y", f"b {CELL_FILE}:9", "c", "detach",
                                        "quit"]).get()
print("stop line shown:", any(s.endswith("-> z = y + 1") for s in shown))
print("listed:", [s.split("\t", 1)[-1].rstrip() for s in shown if "\t" in s][:5])
print("p y:", [s.strip() for s in shown if s.strip() == "12"])
print("breakpoint set:", any(s.startswith("Breakpoint 1 at ") and s.endswith("cell_7.py:9") for s in shown))
[info] = sessions(controller, 1, "double")
print("stopped at it:", info.lineno, any(s.endswith("-> w = x * 2") for s in shown))
shown = controller.run_script.call_one(["attach runner 0", "p x", "c", "quit"]).get()
print("p x:", [s.strip() for s in shown if s.strip() == "13"])
print("answer:", answer.get())
sessions(controller, 0)
print("done")
