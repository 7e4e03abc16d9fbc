"""``stop().get()`` returns once the procs are gone: each proc's pid is free right after (no proc
still ending, none left unreaped), for a host mesh's stop and a proc mesh's.  Runs unchanged on
monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import os

from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


job = ProcessJob({"hosts": 2})
hosts = job.state(cached_path=None).hosts
for round_ in range(3):
    procs = hosts.spawn_procs(per_host={"gpus": 2}, name=f"round{round_}")
    pids = list(procs.spawn(f"pid{round_}", Pid).pid.call().get().values())
    if round_ < 2:
        procs.stop().get()
    else:
        hosts.stop().get()  # the last: Monarch's host mesh takes no new procs after its stop
    print(f"round {round_}: {len(pids)} procs, any left after stop: {any(map(running, pids))}")
hosts.shutdown().get()
job.kill()  # Monarch's ProcessJob leaves its workers running when the program exits
print("done")
