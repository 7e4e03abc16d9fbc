"""Meshes as values: a mesh used before it is known to be up travels all the same.  An actor mesh or
a proc mesh spawned on the line before is passed to an actor as an argument, or returned by an
actor that spawned it on the line before (to ``call_one`` and into a ``call``'s value mesh), and the
side that gets it uses it at once.  With plain ``pickle`` (no message around it) a mesh, fresh or
answering already, comes back as a mesh that works.  Runs unchanged on monarch and on torchmonarch
0.7.0 (tests/compat/test_refs_compat.py compares them).
"""

import pickle

from monarch.actor import Actor, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.n = start

    @endpoint
    async def bump(self) -> int:
        self.n += 1
        return self.n


class User(Actor):
    @endpoint
    async def bump_all(self, counters: Counter) -> list:
        return sorted(value for _, value in await counters.bump.call())

    @endpoint
    async def start_on(self, procs) -> int:
        return await procs.spawn("made_there", Counter, 100).bump.call_one()


class Maker(Actor):
    @endpoint
    async def fresh_counter(self) -> Counter:
        return this_host().spawn_procs(name="made").spawn("fresh", Counter, 10)

    @endpoint
    async def fresh_procs(self):
        return this_host().spawn_procs(per_host={"cpus": 2}, name="made_procs")


host = this_host()
user = host.spawn_procs(name="user").spawn("user", User)
maker = host.spawn_procs(name="maker").spawn("maker", Maker)

counters = host.spawn_procs(per_host={"gpus": 2}, name="counters").spawn("counters", Counter, 0)
print("fresh actor mesh as an argument:", user.bump_all.call_one(counters).get())
print("fresh proc mesh as an argument:", user.start_on.call_one(host.spawn_procs(name="given")).get())

made = maker.fresh_counter.call_one().get()
print("fresh actor mesh returned:", made.bump.call_one().get())
for point, mesh in maker.fresh_counter.call().get():
    print("fresh actor mesh in a value mesh:", point.rank, mesh.bump.call_one().get())
procs = maker.fresh_procs.call_one().get()
print("fresh proc mesh returned:", sorted(v for _, v in procs.spawn("there", Counter, 5).bump.call().get()))

unstarted = host.spawn_procs(name="plain").spawn("plain", Counter, 20)
print("plain pickle, fresh actor mesh:", pickle.loads(pickle.dumps(unstarted)).bump.call_one().get())
print("plain pickle, same actors:", unstarted.bump.call_one().get())
plain_procs = host.spawn_procs(name="plain_procs")
again = pickle.loads(pickle.dumps(plain_procs))
print("plain pickle, fresh proc mesh:", again.spawn("p", Counter, 30).bump.call_one().get())
print("plain pickle, proc mesh in use:",
      pickle.loads(pickle.dumps(plain_procs)).spawn("q", Counter, 40).bump.call_one().get())
print("done")
