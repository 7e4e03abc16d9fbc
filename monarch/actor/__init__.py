"""monarch.actor: the actor API, source-compatible with PyTorch Monarch's.

    from monarch.actor import Actor, endpoint, this_host

    class Counter(Actor):
        def __init__(self, start: int):
            self.n = start

        @endpoint
        def incr(self, by: int = 1) -> int:
            self.n += by
            return self.n

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = procs.spawn("counters", Counter, 10)
    counters.incr.call(2).get()                    # ValueMesh({gpus: 4}) of 12s
    counters.slice(gpus=1).incr.call_one().get()   # 13
"""

from monarch_agents.errors import ActorError, MeshFailure, SupervisionError
from monarch_agents.future import Future
from monarch_agents.ports import Port, PortReceiver, RankedPortReceiver
from monarch.actor._client import Channel
from monarch_agents.supervision import default_fault_hook as unhandled_fault_hook
from monarch.actor._endpoint import Accumulator, Endpoint, NotAnEndpoint, as_endpoint, concurrent_endpoint, endpoint, send
from monarch.actor._mesh import (
    Actor,
    ActorMesh,
    Context,
    HostMesh,
    ProcMesh,
    context,
    current_actor_name,
    current_rank,
    current_size,
    get_or_spawn_controller,
    this_host,
    this_proc,
)
from monarch.actor._shape import Extent, Point, ValueMesh

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "NotAnEndpoint",
    "Point",
    "Port",
    "PortReceiver",
    "RankedPortReceiver",
    "ProcMesh",
    "SupervisionError",
    "ValueMesh",
    "as_endpoint",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "get_or_spawn_controller",
    "send",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]
