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

from typing import Any

from monarch_agents.errors import ActorError, MeshFailure, SupervisionError
from monarch_agents.future import Future
from monarch_agents.ports import Port, PortReceiver, RankedPortReceiver
from monarch.actor._client import Channel
from monarch.actor import _mailbox  # noqa: F401  (a Port with no route returns its value to the sending actor)
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
from monarch.actor._ids import ChannelTransport, ProcId, Uid, enable_transport
from monarch.actor._bootstrap import (
    attach,
    attach_to_workers,
    default_bootstrap_cmd,
    hosts_from_config,
    run_worker_loop_forever,
    run_worker_loop_until_shutdown,
    shutdown_context,
    start_worker_loop_forever,
)
from monarch.actor._returns_future import returns_future
from monarch.actor._tracing import get_meter, span, traced
from monarch.actor import config


def debug_controller() -> Any:
    """Monarch's debugger actor (``monarch._src.actor.debugger.debug_controller``), spawned in the root
    client on first use: from then on ``breakpoint()`` in the job's actors stops in it, driven by its
    command loop, instead of in ``monarch debug`` (README 'Debugging')."""
    from monarch._src.actor.debugger.debug_controller import debug_controller as _debug_controller

    return _debug_controller()

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "ChannelTransport",
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
    "ProcId",
    "Uid",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_meter",
    "get_or_spawn_controller",
    "hosts_from_config",
    "returns_future",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "send",
    "shutdown_context",
    "span",
    "start_worker_loop_forever",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]
