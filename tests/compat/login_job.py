"""A ``LoginJob`` subclass, as Monarch's SSH job is one: ``_start_host`` starts each host's worker
(here a local process serving ``run_worker_loop_forever`` on an ``ipc://`` address) and returns its
``ProcessState``; ``state()`` attaches to the workers, one host mesh per ``add_mesh``; ``can_run``
takes the same meshes while the workers live; ``kill()`` ends them.  Runs unchanged on monarch and
on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import subprocess
import sys
import tempfile

from monarch._src.job.job import LoginJob, ProcessState
from monarch.actor import Actor, current_rank, endpoint


class LocalLogin(LoginJob):
    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder
        self.started: list = []

    def _start_host(self, host: str) -> ProcessState:
        address = f"ipc://{self.folder}/{host}"
        code = ("from monarch.actor import run_worker_loop_forever; "
                f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')")
        p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        self.started.append(p)
        return ProcessState(p.pid, address)


class Greeter(Actor):
    @endpoint
    def greet(self, who: str) -> str:
        return f"hello {who} from {current_rank().rank}"


with tempfile.TemporaryDirectory() as d:
    job = LocalLogin(d)
    job.add_mesh("trainers", ["t0", "t1"])
    job.add_mesh("server", ["s0"])
    state = job.state(cached_path=None)
    print("meshes:", len(state.trainers), len(state.server))
    print("state tuple:", [(type(s).__name__, s.channel.startswith("ipc://")) for s in job._host_to_pid.values()])
    procs = state.trainers.spawn_procs(per_host={"gpus": 2})
    print("trainers:", sorted(procs.spawn("greeter", Greeter).greet.call("you").get().values()))
    print("server:", state.server.spawn_procs().spawn("greeter", Greeter).greet.call_one("me").get())
    again = LocalLogin(d)
    again.add_mesh("trainers", ["t0", "t1"])
    again.add_mesh("server", ["s0"])
    other = LocalLogin(d)
    other.add_mesh("trainers", ["t0"])
    print("can run the same meshes:", job.can_run(again), "other meshes:", job.can_run(other))
    try:
        LocalLogin(d).apply(client_script="x.py")
    except Exception as e:
        print("batch mode:", type(e).__name__)
    job.kill()
    for p in job.started:
        p.wait(timeout=60)
    print("workers ended:", [p.returncode for p in job.started])
print("done")
