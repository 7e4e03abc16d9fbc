"""What a program sees of meshes that failed: actors spawned on a proc mesh whose bootstrap raised,
and a proc of a nested mesh killed under an actor that does not supervise it.

Spawning on a mesh that never came up returns a mesh at once: its ``initialized`` and each call
raise the mesh's failure, a broadcast is dropped, and stopping the proc mesh raises it too.  A proc
killed under a nested mesh reaches the client's ``unhandled_fault_hook`` naming the nested actor
and the signal, as Monarch words them.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import contextlib
import os
import re
import threading
import time
import warnings

import monarch.actor
from monarch.actor import Actor, endpoint, this_host

warnings.simplefilter("ignore", RuntimeWarning)
faults: list = []
fault_seen = threading.Event()


def hook(failure) -> None:
    faults.append(failure)
    fault_seen.set()


def fault_naming(word: str):
    """The first fault whose report names ``word`` (others, late ones of an earlier step, are skipped)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for f in list(faults):
            if word in f.report():
                return f
        fault_seen.wait(0.1)
        fault_seen.clear()
    raise TimeoutError(f"no fault names {word!r}: {[f.report() for f in faults]}")


monarch.actor.unhandled_fault_hook = hook


def no_gpus_here() -> None:
    raise RuntimeError("no gpus here")


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


def outcome(fn) -> str:
    try:
        return f"returned {fn()!r}"
    except Exception as e:
        return f"{type(e).__name__} (names its cause: {'no gpus here' in str(e)})"


broken = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=no_gpus_here)
echoes = broken.spawn("echo", Echo)
print("spawn on a failed mesh returned:", type(echoes).__name__)
print("initialized:", outcome(lambda: echoes.initialized.get()))
print("call:", outcome(lambda: echoes.echo.call(1).get()))
print("call_one:", outcome(lambda: echoes.slice(gpus=1).echo.call_one(1).get()))
print("stream:", outcome(lambda: [f.get() for f in echoes.echo.stream(1)]))
echoes.echo.broadcast(1)
print("broadcast: dropped")
print("stop:", outcome(lambda: broken.stop().get()))
print("faults so far:", len(faults))


class Leaf(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Nest(Actor):
    def __init__(self):
        self.leaves = this_host().spawn_procs(per_host={"a_dim": 1}).spawn("leaf", Leaf)

    @endpoint
    def kill_leaf(self) -> None:
        os.kill(self.leaves.pid.call_one().get(), 9)


nest = this_host().spawn_procs().spawn("nest", Nest)
nest.kill_leaf.call_one().get()
report = fault_naming("a_dim").report()
print("nested proc killed: the report names a proc's actor:", bool(re.search(r"(leaf|logger-.*)\{'a_dim': 0/1\}", report)))
print("nested proc killed: the report names the signal:",
      "the process this actor was running on failed: Killed(sig=9)" in report)


class Quitter(Actor):
    @endpoint
    def quit(self, reason) -> None:
        from monarch.actor import context

        context().actor_instance.abort(reason)


for n, reason in enumerate((None, "out of patience")):
    quitter = this_host().spawn_procs().spawn(f"quitter{n}", Quitter)
    with contextlib.suppress(Exception):  # the call's answer may race the abort
        quitter.quit.call_one(reason).get()
    print(f"abort({reason!r}): the report says why:", (reason or "no reason provided") in fault_naming(f"quitter{n}").report())
print("done")
