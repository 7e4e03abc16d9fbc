# PyTorch Monarch's documented example docs/source/examples/ping_pong.py, run on two hosts of a
# monarch.job.ProcessJob. Changed from the original: the first lines that make the job, each
# `this_host()` replaced by one host of the job (`hosts.slice(hosts=N)`), so actor_0 and actor_1
# ping-pong across hosts, and `job.kill()` at the end. The actors print into the hosts' proc logs
# (.monarch/jobs/<job>/logs/host<N>/procs/), which the test reads.
"""
Monarch Actor API: Ping Pong
====================================

This example demonstrates the basics of Monarch's Actor/endpoint API, which provides
a generic interface for distributed computing. We'll cover:

- Creating and spawning actors in process meshes
- Calling endpoints on actors
- Actor-to-actor communication with a ping-pong example
"""

from monarch.actor import Actor, current_rank, endpoint
from monarch.job import ProcessJob

job = ProcessJob({"hosts": 2})
hosts = job.state().hosts

NUM_ACTORS = 4


class ToyActor(Actor):
    def __init__(self):
        self.rank = current_rank().rank

    @endpoint
    def hello_world(self, msg):
        print(f"Identity: {self.rank}, {msg=}")


local_proc_mesh = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": NUM_ACTORS})
toy_actor = local_proc_mesh.spawn("toy_actor", ToyActor)


toy_actor.hello_world.call("hey there, from script!!").get()


futures = []
for idx in range(NUM_ACTORS):
    actor_instance = toy_actor.slice(gpus=idx)
    futures.append(
        actor_instance.hello_world.call_one(f"Here's an arbitrary unique value: {idx}")
    )

for fut in futures:
    fut.get()


class ExampleActor(Actor):
    def __init__(self, actor_name):
        self.actor_name = actor_name

    @endpoint
    def init(self, other_actor):
        self.other_actor = other_actor
        self.other_actor_pair = other_actor.slice(**current_rank())
        self.identity = current_rank().rank

    @endpoint
    def send(self, msg):
        self.other_actor_pair.recv.call(
            f"Sender ({self.actor_name}:{self.identity}) {msg=}"
        ).get()

    @endpoint
    def recv(self, msg):
        print(f"Pong!, Receiver ({self.actor_name}:{self.identity}) received msg {msg}")


local_mesh_0 = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 2})
actor_0 = local_mesh_0.spawn(
    "actor_0",
    ExampleActor,
    "actor_0",  # this arg is passed to ExampleActor.__init__
)

local_mesh_1 = hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 2})
actor_1 = local_mesh_1.spawn(
    "actor_1",
    ExampleActor,
    "actor_1",  # this arg is passed to ExampleActor.__init__
)


actor_0.init.call(actor_1).get()
actor_1.init.call(actor_0).get()


actor_0.send.call("Ping").get()

actor_1.send.call("Ping").get()

job.kill()
print("Example completed successfully!")
