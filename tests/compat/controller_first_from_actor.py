"""``get_or_spawn_controller`` asked first by actors, not by the client: the job's one controller of
that name is spawned then (in the client), every actor that asks gets that same one, and so does
the client when it asks afterwards.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_refs_compat.py compares them).
"""

from monarch.actor import Actor, endpoint, get_or_spawn_controller, this_host


class Tally(Actor):
    def __init__(self) -> None:
        self.seen: list = []

    @endpoint
    def add(self, who: int) -> int:
        self.seen.append(who)
        return len(self.seen)

    @endpoint
    def who(self) -> list:
        return sorted(self.seen)


class Worker(Actor):
    @endpoint
    def report(self, me: int) -> int:
        return get_or_spawn_controller("tally", Tally).get().add.call_one(me).get()


procs = this_host().spawn_procs(per_host={"gpus": 3})
workers = procs.spawn("workers", Worker)
counts = [workers.slice(gpus=i).report.call_one(10 + i).get() for i in range(3)]
print("counts as each worker reported:", counts)
print("the client's tally saw:", get_or_spawn_controller("tally", Tally).get().who.call_one().get())
procs.stop().get()
print("done")
