"""A single-controller actor program on the reserved hosts, as PyTorch Monarch programs reach their job's hosts.

    $ monarch serve --hosts 2
    $ monarch run examples/actors.py

`job_load()` loads the reservation `monarch serve` made (`monarch run` points it at the
reservation it runs on); `this_host()` would be this machine, as in Monarch.
"""

import os

from monarch.actor import Actor, current_rank, endpoint
from monarch.job import job_load


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    def where(self) -> str:
        return f"rank {current_rank().rank} on {os.environ.get('MONARCH_HOSTNAME')} (pid {os.getpid()})"


if __name__ == "__main__":
    hosts = job_load().state().hosts                      # HostMesh over {hosts: N}
    procs = hosts.spawn_procs(per_host={"gpus": 2})       # {hosts: N, gpus: 2}
    counters = procs.spawn("counters", Counter, 10)
    print(counters.incr.call(2).get())                    # ValueMesh of 12s
    print(counters.slice(hosts=0, gpus=1).incr.call_one().get())   # 13: one actor
    for line in counters.where.call().get().values():
        print(line)
    procs.stop().get()
