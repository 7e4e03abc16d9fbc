"""A proc that dies fails every actor mesh that ran on it: the mesh's owner hears once per actor mesh,
under that mesh's name (the client's unhandled_fault_hook for meshes it spawned, an actor's
``__supervise__`` for its own), not once for the proc mesh.  Runs unchanged on monarch and on
torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them); Monarch's runtime also fails a
logging mesh of its own, which this program leaves out.
"""

import os
import signal
import time

import monarch.actor
from monarch.actor import Actor, endpoint, this_host

OURS = ("alpha", "beta", "kids", "pets")


def short(failure) -> str:
    return failure.mesh_name.split("-")[0]  # Monarch's mesh names carry a suffix


class Victim(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Owner(Actor):
    def __init__(self) -> None:
        self.seen: list = []

    @endpoint
    def start(self) -> int:
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.kids = self.procs.spawn("kids", Victim)
        self.pets = self.procs.spawn("pets", Victim)
        self.pets.initialized.get()
        return self.kids.pid.call().get().values()[1]

    @endpoint
    def seen_names(self) -> list:
        return sorted(self.seen)

    def __supervise__(self, failure) -> bool:
        if short(failure) in OURS:
            self.seen.append(short(failure))
        return True


def wait_for(get, n: int) -> list:
    deadline = time.monotonic() + 90
    while len(get()) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    return get()


heard: list = []
monarch.actor.unhandled_fault_hook = lambda failure: heard.append(short(failure))

procs = this_host().spawn_procs(per_host={"gpus": 2})
alpha = procs.spawn("alpha", Victim)
beta = procs.spawn("beta", Victim)
pids = alpha.pid.call().get().values()
beta.initialized.get()
os.kill(pids[1], signal.SIGKILL)
print("client heard:", sorted(n for n in wait_for(lambda: [n for n in heard if n in OURS], 2)))
try:
    alpha.pid.call().get()
except Exception as e:  # Monarch's SupervisionError is not in monarch.actor
    print("a later call:", type(e).__name__, str(e).splitlines()[0])

owner_procs = this_host().spawn_procs(per_host={"gpus": 1})
owner = owner_procs.spawn("owner", Owner)
os.kill(owner.start.call_one().get(), signal.SIGKILL)
print("owner heard:", wait_for(lambda: owner.seen_names.call_one().get(), 2))
print("client heard nothing more:", sorted(n for n in heard if n in OURS) == ["alpha", "beta"])
procs.stop().get()
owner_procs.stop().get()
print("done")
