"""Which actor is running, and which message it is handling.

The proc agent sets :data:`CURRENT` around every endpoint call; the public
``current_rank()``, ``current_size()`` and ``context()`` read it.  Outside any
actor (the client) there is no current actor, and the rank is 0 of an empty
extent.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class ActorSlotInfo:
    """What an actor knows about itself."""

    actor_id: str
    name: str
    class_name: str
    point: dict  # its coordinates in the proc mesh it was spawned on
    extent: dict
    rank: int
    host: str
    proc_addr: str
    owner: str
    slot: Any = None  # the proc agent's record, for supervision
    qualname: str = ""  # Monarch's name for the instance, ``<root>.<mod.Cls name{'gpus': 0/2}>``


@dataclass
class MessageContext:
    actor: ActorSlotInfo | None
    point: dict = field(default_factory=dict)  # relative to the slice that was messaged
    extent: dict = field(default_factory=dict)
    rank: int = 0
    #: The ``Context`` that ``monarch.actor.context()`` made for this message, so that every call
    #: while handling it (in any task or thread it started) returns the same object, as Monarch's does.
    view: Any = field(default=None, repr=False, compare=False)


ROOT = MessageContext(None)
CURRENT: contextvars.ContextVar[MessageContext] = contextvars.ContextVar("monarch_context", default=ROOT)


def current() -> MessageContext:
    return CURRENT.get()


#: What this process's ``monarch.config.configure`` set, as plain values (``monarch.config`` sets
#: it when imported: this layer cannot import that one); a proc agent's answer to ``ConfigDump``.
config_source: Callable[[], dict] | None = None
