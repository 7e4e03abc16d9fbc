"""Log records written inside an actor carry the actor's name, as in Monarch.

``[actor=<root>.<mod.Trainer trainers{'gpus': 0/2}>] step 3 done``: the filter
goes on every handler of the root logger, and on handlers added later.  Empty
messages are left alone (torch.compile's structured trace logging uses them).
"""

from __future__ import annotations

import logging
import threading

from monarch_agents.context import CURRENT


class ActorPrefixFilter(logging.Filter):
    """Prefix the message of a record made inside an actor with ``[actor=NAME] ``."""

    def filter(self, record: logging.LogRecord) -> bool:
        actor = CURRENT.get().actor
        if actor is not None and record.msg and _prefix_on() and not getattr(record, "actor_prefix", None):
            prefix = f"[actor={actor.qualname or actor.name}] "
            record.actor_prefix = prefix
            record.msg = f"{prefix}{record.msg}"
        return True


#: Whether records made in an actor get the prefix (the actor API's config sets it).
PREFIX_WITH_ACTOR = True


def _prefix_on() -> bool:
    return PREFIX_WITH_ACTOR


_filter = ActorPrefixFilter()
_lock = threading.Lock()
_installed = False


def install() -> None:
    """Put the filter on the root logger's handlers, now and as they are added (once per process)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    for handler in logging.getLogger().handlers:
        handler.addFilter(_filter)
    original = logging.Logger.addHandler

    def add_handler(self: logging.Logger, hdlr: logging.Handler) -> None:
        original(self, hdlr)
        if _filter not in hdlr.filters:
            hdlr.addFilter(_filter)

    logging.Logger.addHandler = add_handler  # type: ignore[method-assign]
