"""Who spawned an actor (``context().actor_instance.creator``): the client, named ``root``, or the
creating actor, by its mesh name; ``str()`` is the full name.  And ``monarch.actor.config`` pickles
by name (a function using it can be sent with cloudpickle).  Runs unchanged on monarch and on
torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import cloudpickle

import monarch.actor
from monarch.actor import Actor, context, endpoint, this_host


class Kid(Actor):
    @endpoint
    def creator(self) -> tuple:
        c = context().actor_instance.creator
        return c.name, str(c)


class Parent(Actor):
    @endpoint
    def creator(self) -> tuple:
        c = context().actor_instance.creator
        return c.name, str(c)

    @endpoint
    def kids_creator(self) -> tuple:
        return this_host().spawn_procs().spawn("kid", Kid).creator.call_one().get()


parent = this_host().spawn_procs().spawn("parent", Parent)
print("spawned by the client:", parent.creator.call_one().get())
print("spawned by an actor:", parent.kids_creator.call_one().get())


def uses_config() -> bool:
    return monarch.actor.config.prefix_python_logs_with_actor


print("a function using monarch.actor.config pickles:", cloudpickle.loads(cloudpickle.dumps(uses_config))())
