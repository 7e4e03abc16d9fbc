"""Compatibility only: ``breakpoint()`` in an actor, when the program made Monarch's debugger actor.

A proc agent offers each ``breakpoint()`` in an actor here first (``monarch_agents.debug_rank``'s
``actor_debugger``).  If the job has a controller called ``debug_controller`` (the program spawned
Monarch's ``DebugController``, or a subclass, with ``get_or_spawn_controller``), the actor stops in a
:class:`PdbWrapper` session of that actor; as in Monarch, when the endpoint returns the session is
continued and ended, and when it raises, a post-mortem session on what it raised comes first.
Without such a controller the breakpoint goes to ``monarch debug``, as any other.
"""

from __future__ import annotations

import contextvars
import logging
from types import FrameType
from typing import Any, Optional

from monarch._src.actor.debugger.pdb_wrapper import PdbWrapper

log = logging.getLogger(__name__)

#: The name Monarch's debugger actor is spawned under (``debug_controller()``).
CONTROLLER_NAME = "debug_controller"

#: The session of the message being handled, if its endpoint stopped in the debugger actor.
_session: contextvars.ContextVar[Optional[PdbWrapper]] = contextvars.ContextVar("monarch_debug_session",
                                                                                   default=None)
#: The job's debugger actor, once found (it lives as long as the client: looked up once).
_controller: Any = None


def find_controller() -> Any:
    """The job's ``debug_controller`` actor if the program made one, else None (none is made)."""
    global _controller
    if _controller is None:
        from monarch.actor._mesh import _controllers_mesh

        _controller = _controllers_mesh().find.call_one(CONTROLLER_NAME).get()
    return _controller


def _new_session(header: str | None = None) -> Optional[PdbWrapper]:
    from monarch.actor import context

    controller = find_controller()
    if controller is None:
        return None
    ctx = context()
    point = ctx.message_rank
    return PdbWrapper(point.rank, {k: point[k] for k in point}, ctx.actor_instance.actor_id, controller, header)


def actor_breakpoint(frame: FrameType, header: str | None) -> bool:
    """Stop in ``frame`` in a session of the debugger actor; False where there is none to take it."""
    from monarch_agents import proc_agent
    from monarch_agents.context import current

    if current().actor is None:
        return False
    try:
        session = _new_session(header)
    except Exception as e:  # the client cannot be asked: monarch debug takes it
        log.debug("no debugger actor to ask: %s", e)
        return False
    if session is None:
        return False
    _session.set(session)
    proc_agent.debug_exit = endpoint_exit
    session.set_trace(frame)
    return True


def endpoint_exit(raised: BaseException | None) -> None:
    """The endpoint of the message being handled ended: end its session (after a post-mortem on what
    it raised), as Monarch's actors do."""
    session = _session.get()
    if session is None:
        return
    _session.set(None)
    try:
        if raised is None:
            session.clear_all_breaks()
            session.set_continue()
        else:
            # A fresh session on the traceback, in the same (actor, rank) slot of the debugger actor.
            session = _new_session() or session
            session.post_mortem(raised.__traceback__)  # type: ignore[arg-type]
        session.end_debug_session()
    except Exception as e:  # the debugger went away: the actor goes on without it
        log.debug("ending a debug session: %s", e)


def install() -> None:
    """Offer this proc's actors' breakpoints to the debugger actor first (``monarch_agents.debug_rank``)."""
    from monarch_agents import debug_rank

    debug_rank.actor_debugger = actor_breakpoint
