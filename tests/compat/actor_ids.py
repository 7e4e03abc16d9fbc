"""``context().actor_instance.actor_id`` as Monarch's programs read it: an actor's id names the
actor by the name it was spawned with (``actor_name``, ``label``), has a ``uid`` of that name and a
unique value (``name<v>``, also its ``pid``), is no root, and names its process (``proc_name``,
``proc_label``, ``proc_id``); every rank's id differs, and one actor's id is the same from call to
call.  The client's id is the root ``client``.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_refs_compat.py compares them).
"""

from monarch.actor import Actor, context, endpoint, this_host


class Worker(Actor):
    @endpoint
    def whoami(self) -> tuple:
        me = context().actor_instance.actor_id
        return (str(me), me.actor_name, me.label, me.uid.startswith(me.actor_name + "<") and me.uid.endswith(">"),
                me.pid == me.uid, me.is_root, me.proc_label == me.proc_name, me.proc_name in me.proc_id,
                str(context().actor_instance.actor_id) == str(me))


procs = this_host().spawn_procs(per_host={"gpus": 2})
workers = procs.spawn("worker", Worker)
answers = [v for _, v in workers.whoami.call().get()]
for a in answers:
    print("names:", a[1:3], "uid name<v>:", a[3], "pid is uid:", a[4], "root:", a[5], "proc names:", a[6:8],
          "stable:", a[8])
print("ranks differ:", len({a[0] for a in answers}) == len(answers))
print("same again:", [v[0] for _, v in workers.whoami.call().get()] == [a[0] for a in answers])
client = context().actor_instance.actor_id
print("client:", client.actor_name, client.uid, client.label)
procs.stop().get()
print("done")
