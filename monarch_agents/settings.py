"""The few ``monarch.config`` settings this layer applies itself, read where they are needed.

``monarch.config`` lives a layer above (this one cannot import it); where it is imported (a
client, a proc running actors) it sets :data:`source`, so what ``configure`` set applies here at
once.  Elsewhere (a host agent) a setting comes from what a client handed down to this process
(``MONARCH_CLIENT_CONFIG``), then from Monarch's environment variable, then from its default.

=============================  ===================================  ====================================
setting                        where                                 environment
=============================  ===================================  ====================================
``message_delivery_timeout``   ``transport``: a peer that takes      ``HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT``
                               none of a client's or a proc's
                               messages for that long is lost;
                               cross-host liveness and connecting
                               are bounded by it too
=============================  ===================================  ====================================
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable

#: Set by ``monarch.config`` when imported: ``key`` -> its seconds as it applies now (None: no limit).
source: Callable[[str], float | None] | None = None

_ENV = {"message_delivery_timeout": "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT"}
_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "mins": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")


def _parse(value: object) -> float | None:
    """Seconds in a number or a simple humantime string ("30s", "1m 30s", "250ms"); None if neither."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _PART.findall(text)
    if not parts or _PART.sub("", text).strip() or any(u not in _UNITS for _, u in parts):
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def seconds(key: str, default: float) -> float:
    """The duration setting ``key`` in this process, in seconds; ``default`` where nothing (valid) sets it."""
    if source is not None:
        try:
            value = source(key)
            return default if value is None else float(value)
        except Exception:  # a bad value was already reported where it was set; never break a send
            return default
    try:
        handed = json.loads(os.environ.get("MONARCH_CLIENT_CONFIG") or "{}")
    except ValueError:
        handed = {}
    for value in ((handed.get(key) if isinstance(handed, dict) else None), os.environ.get(_ENV.get(key, ""))):
        parsed = _parse(value)
        if parsed is not None and parsed >= 0:
            return parsed
    return default
