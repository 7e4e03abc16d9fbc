"""What an actor learns of its own proc from ``context().actor_instance``, as Monarch's actors guide
(docs/source/actors.md) reads it: ``proc_id`` (the proc its ``actor_id`` names) and ``proc`` (a
mesh of that one proc, where it can spawn a sibling).  Runs unchanged on monarch and on
torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

from monarch.actor import Actor, context, endpoint, this_host


class Sibling(Actor):
    @endpoint
    def where(self) -> str:
        return context().actor_instance.proc_id


class Worker(Actor):
    @endpoint
    def whoami(self) -> tuple:
        me = context().actor_instance
        sibling = me.proc.spawn("sibling", Sibling)
        return (isinstance(me.proc_id, str), me.proc_id == me.actor_id.proc_id, me.proc_id,
                sibling.where.call_one().get() == me.proc_id)


procs = this_host().spawn_procs(per_host={"gpus": 2})
answers = [v for _, v in procs.spawn("worker", Worker).whoami.call().get()]
for a in answers:
    print("proc_id is a str:", a[0], "as its actor_id says:", a[1], "a sibling's is the same:", a[3])
print("ranks' procs differ:", len({a[2] for a in answers}) == len(answers))
procs.stop().get()
print("done")
