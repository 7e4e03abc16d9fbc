"""One program, meshes of two jobs and of this machine: every call reaches its own job.

Usage: python two_jobs.py STATE_A STATE_B   (two reservations' state files, e.g. two
`monarch serve` in two folders).  Each job has its own keys; the program talks to both at
once, passes a mesh of one job to an actor of the same job, and a port of the client to both.
"""

import sys

from monarch.actor import Actor, Channel, endpoint, this_host
from monarch.job import job_load


class Tally(Actor):
    def __init__(self, label: str):
        self.label = label
        self.n = 0

    @endpoint
    def add(self, k: int) -> str:
        self.n += k
        return f"{self.label}:{self.n}"

    @endpoint
    def poke(self, other) -> list:
        # A mesh of this actor's own job, called from inside it.
        return sorted(v for _, v in other.add.call(100).get().items())

    @endpoint
    def report(self, port) -> None:
        port.send(self.label)


local = this_host().spawn_procs(per_host={"procs": 1}).spawn("local", Tally, "local")
meshes = {}
for tag, path in zip("AB", sys.argv[1:3]):
    hosts = job_load(path).state().hosts
    procs = hosts.spawn_procs(per_host={"procs": 2})
    meshes[tag] = (procs.spawn(f"t{tag}", Tally, tag), procs.spawn(f"u{tag}", Tally, tag.lower()))

for round_ in range(2):
    for tag, (t, _) in meshes.items():
        print(round_, tag, sorted(v for _, v in t.add.call(1).get().items()))
    print(round_, "local", local.add.call_one(1).get())

for tag, (t, u) in meshes.items():
    print("inside", tag, t.slice(hosts=0, procs=0).poke.call_one(u).get())

port, recv = Channel.open()
for t, _ in meshes.values():
    t.slice(hosts=0, procs=0).report.call_one(port).get()
    print("port", recv.recv().get())
print("done")
