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
        name = ROOT_NAME if actor is None else actor.qualname or actor.name
        if name is not None and record.msg and _prefix_on() and not getattr(record, "actor_prefix", None):
            prefix = f"[actor={name}] "
            record.actor_prefix = prefix
            record.msg = f"{prefix}{record.msg}"
        return True


#: Whether records made in an actor get the prefix (the actor API's config sets it).
PREFIX_WITH_ACTOR = True

#: The name records made outside any actor carry: ``<root>`` in the root client (as Monarch's
#: client prefixes its own records once it runs), None elsewhere (left alone).
ROOT_NAME: str | None = None


def _prefix_on() -> bool:
    return PREFIX_WITH_ACTOR


_filter = ActorPrefixFilter()
_lock = threading.Lock()
_installed = False


def install(root_name: str | None = None) -> None:
    """Put the filter on the root logger's handlers, now and as they are added (once per process);
    ``root_name``: what records made outside any actor are prefixed with (the root client's)."""
    global _installed, ROOT_NAME
    if root_name is not None:
        ROOT_NAME = root_name
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
