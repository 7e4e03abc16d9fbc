"""Compatibility only: Monarch's ``monarch._src.actor.actor_mesh`` names, aliases of ``monarch.actor``'s."""

from monarch.actor import (  # noqa: F401
    Accumulator,
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    Context,
    Endpoint,
    Point,
    Port,
    PortReceiver,
    RankedPortReceiver,
    ValueMesh,
    as_endpoint,
    attach,
    context,
    current_actor_name,
    current_rank,
    current_size,
    enable_transport,
    send,
    shutdown_context,
)

IN_PAR = False  # Monarch's: whether it runs from a Meta-internal .par archive; never here

from monarch._src._placeholder import placeholder  # noqa: E402
from monarch.actor._mesh import _client_context  # noqa: E402, F401
from monarch.actor._mesh import ActorInstance as Instance  # noqa: E402, F401 - what context().actor_instance is

_context = placeholder(__name__, "_context")
