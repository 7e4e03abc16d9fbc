"""A failure nobody handles, and the program keeps Monarch's default unhandled_fault_hook: the client ends.

The default hook leaves the failure unhandled (it exits), so the client's main thread gets a
KeyboardInterrupt and atexit handlers run.  torchmonarch 0.7.0 raises it in the main thread once the
current sleep returns; ours interrupts the sleep itself: the short sleeps make both end soon.  Runs
unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import atexit
import time

from monarch.actor import Actor, endpoint, this_host


class Doomed(Actor):
    @endpoint
    def fail_quietly(self, why: str) -> None:
        raise RuntimeError(why)


atexit.register(lambda: print("atexit handler ran", flush=True))

procs = this_host().spawn_procs(per_host={"gpus": 2})
doomed = procs.spawn("doomed", Doomed)
doomed.initialized.get()
print("spawned", flush=True)
# The interrupt may come while broadcast() is still returning (the failure can be that quick): inside the try.
try:
    doomed.fail_quietly.broadcast("a broadcast nobody waits on")  # the failure goes to the client's hook
    for _ in range(1200):
        time.sleep(0.1)
    print("the client outlived the failure")
except KeyboardInterrupt:
    print("main thread interrupted", flush=True)
    raise
