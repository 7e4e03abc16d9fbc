"""A ``ProcessJob`` subclass that starts its hosts' worker loops itself (its ``_create`` fills
``_host_to_pid`` with each worker's pid and ``ipc://`` address, as Monarch's ProcessJob does): the
job's host meshes are those workers, attached; ``kill()`` ends them.  Usage: python
own_workers_job.py DIR.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import os
import subprocess
import sys
import time

from monarch.actor import Actor, current_rank, endpoint
from monarch.job import ProcessJob
from monarch._src.job.job import ProcessState


class Where(Actor):
    @endpoint
    def where(self) -> tuple:
        return current_rank()["hosts"], os.getppid() != os.getpid()


class OwnWorkers(ProcessJob):
    def _create(self, client_script):
        self.started = []
        for name, count in self._meshes.items():
            for i in range(count):
                address = f"ipc://{os.path.join(sys.argv[1], f'{name}_{i}')}"
                p = subprocess.Popen([sys.executable, "-c", "from monarch.actor import run_worker_loop_forever; "
                                      f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')"],
                                     start_new_session=True)
                self.started.append(p)
                self._host_to_pid[f"{name}_{i}"] = ProcessState(p.pid, address)


job = OwnWorkers({"trainers": 2})
try:
    state = job.state(cached_path=None)
    print("workers:", sorted(job._host_to_pid))
    procs = state.trainers.spawn_procs(per_host={"gpus": 1})
    print("ranks:", sorted(procs.spawn("where", Where).where.call().get().values()))
finally:
    job.kill()
for p in job.started:
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    print("worker ended:", p.poll() is not None)
    if p.poll() is None:
        p.kill()
        p.wait()
