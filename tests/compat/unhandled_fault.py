"""A failure nobody handles: the client's unhandled_fault_hook raises, so the client ends.

As in Monarch, the main thread gets a KeyboardInterrupt (even from a sleep), so the interpreter
finalizes there and atexit handlers run.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import atexit
import sys
import time

import monarch.actor
from monarch.actor import Actor, endpoint, this_host


class Careless(Actor):
    @endpoint
    def blow_up(self) -> None:
        raise ValueError("no caller waits for this")


def give_up(failure) -> None:
    print("hook saw:", type(failure).__name__, flush=True)
    sys.exit(1)  # raising makes the failure unhandled


monarch.actor.unhandled_fault_hook = give_up
atexit.register(lambda: print("atexit handler ran", flush=True))

procs = this_host().spawn_procs(per_host={"gpus": 1})
careless = procs.spawn("careless", Careless)
careless.initialized.get()
# The interrupt may come while broadcast() is still returning (the failure can be that quick): inside the try.
try:
    careless.blow_up.broadcast()  # nobody waits for its answer: the failure goes to the client's hook
    time.sleep(120)
    print("slept through it")
except KeyboardInterrupt:
    print("main thread interrupted", flush=True)
    raise
