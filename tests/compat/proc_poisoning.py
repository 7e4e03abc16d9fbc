"""A proc whose actor failed takes no new actors (Monarch's "poisoned" proc).

Once an actor fails on a proc (an endpoint dies with nobody to answer, a BaseException, a failed
``__init__``), spawning on that proc fails: ``initialized`` and each call of the new mesh raise a
RuntimeError naming "error spawning actor mesh" and "Cannot spawn new actors on mesh with
supervision events".  The actors already there go on answering, and procs of the mesh where
nothing failed take new actors.  The same holds for the client's own proc.  Runs unchanged on
monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import threading
import time

import monarch.actor
from monarch.actor import Actor, endpoint, this_host, this_proc

faults: list = []
fault_seen = threading.Event()


def hook(failure) -> None:
    faults.append(failure)
    fault_seen.set()


monarch.actor.unhandled_fault_hook = hook


class Dies(BaseException):
    """Not an Exception: the actor dies of it even though a caller waits."""


class Fragile(Actor):
    def __init__(self, fail_init: bool = False) -> None:
        if fail_init:
            raise ValueError("no init for you")

    @endpoint
    def die(self) -> None:
        raise Dies("this actor is done")


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


def outcome(fn) -> str:
    try:
        return f"returned {fn()!r}"
    except BaseException as e:
        text = str(e)
        return (f"{type(e).__name__} (RuntimeError: {isinstance(e, RuntimeError)}, "
                f"spawn error: {'error spawning actor mesh' in text}, "
                f"poisoned: {'Cannot spawn new actors on mesh with supervision events' in text})")


def wait_faults(n: int) -> None:
    deadline = time.monotonic() + 60
    while len(faults) < n and time.monotonic() < deadline:
        fault_seen.wait(0.1)
        fault_seen.clear()


def values(mesh) -> list:
    return sorted(v for _, v in mesh.items())


procs = this_host().spawn_procs(per_host={"gpus": 2})
fragile = procs.spawn("fragile", Fragile)
echo = procs.spawn("echo", Echo)
fragile.initialized.get()
echo.initialized.get()
print("before:", outcome(lambda: values(procs.spawn("early", Echo).echo.call(1).get())))
print("fragile[0] dies:", outcome(lambda: fragile.slice(gpus=0).die.call_one().get()))
wait_faults(1)
print("faults:", len(faults))
print("echo still answers:", outcome(lambda: values(echo.echo.call(2).get())))
late = procs.spawn("late", Echo)
print("spawn on both procs, initialized:", outcome(lambda: late.initialized.get()))
print("spawn on both procs, call:", outcome(lambda: late.echo.call(3).get()))
print("spawn on the poisoned proc:", outcome(lambda: procs.slice(gpus=0).spawn("late0", Echo).initialized.get()))
healthy = procs.slice(gpus=1).spawn("late1", Echo)
print("spawn on the healthy proc:", outcome(lambda: healthy.initialized.get()))
print("its call:", outcome(lambda: values(healthy.echo.call(4).get())))

others = this_host().spawn_procs(per_host={"gpus": 1})
others.spawn("bad_init", Fragile, fail_init=True)
wait_faults(2)
print("after a failed __init__:", outcome(lambda: others.spawn("next", Echo).initialized.get()))

local = this_proc().spawn("local_fragile", Fragile)
print("local dies:", outcome(lambda: local.die.call_one().get()))
wait_faults(3)
print("spawn on the client's proc:", outcome(lambda: this_proc().spawn("local_next", Echo).initialized.get()))
print("faults:", len(faults))
print("stop:", outcome(lambda: procs.stop().get()), outcome(lambda: others.stop().get()))
print("done")
