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
``codec_max_frame_length``     ``transport``: a message of more      ``HYPERACTOR_CODEC_MAX_FRAME_LENGTH``
                               bytes is not sent (the sender's
                               call fails); only messages of
                               ``CHECK_FROM`` bytes and more are
                               measured against it
=============================  ===================================  ====================================
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable

#: Set by ``monarch.config`` when imported: ``key`` -> its seconds as it applies now (None: no limit).
source: Callable[[str], float | None] | None = None
#: Set by ``monarch.config`` when imported: ``key`` -> its integer as it applies now.
int_source: Callable[[str], int] | None = None

_ENV = {"message_delivery_timeout": "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",
        "codec_max_frame_length": "HYPERACTOR_CODEC_MAX_FRAME_LENGTH"}

#: Monarch's default ``codec_max_frame_length``: 10 GiB.
MAX_FRAME_LENGTH = 10 << 30
#: Messages shorter than this are sent without reading ``codec_max_frame_length``: reading a
#: setting costs as much as sending a small message, and every call and answer is one.  Monarch's
#: own control messages are a few hundred bytes, so a limit that low would stop its runtime too.
CHECK_FROM = 64 * 1024
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


def _handed(key: str) -> object:
    """``key`` as the client handed its settings down to this process (``MONARCH_CLIENT_CONFIG``), else None."""
    try:
        handed = json.loads(os.environ.get("MONARCH_CLIENT_CONFIG") or "{}")
    except ValueError:
        return None
    return handed.get(key) if isinstance(handed, dict) else None


def seconds(key: str, default: float) -> float:
    """The duration setting ``key`` in this process, in seconds; ``default`` where nothing (valid) sets it."""
    if source is not None:
        try:
            value = source(key)
            return default if value is None else float(value)
        except Exception:  # a bad value was already reported where it was set; never break a send
            return default
    for value in (_handed(key), os.environ.get(_ENV.get(key, ""))):
        parsed = _parse(value)
        if parsed is not None and parsed >= 0:
            return parsed
    return default


def max_frame_length() -> int:
    """``codec_max_frame_length`` in this process: the longest message it sends, in bytes."""
    if int_source is not None:
        try:
            return int_source("codec_max_frame_length")
        except Exception:  # a bad value was already reported where it was set; never break a send
            return MAX_FRAME_LENGTH
    for value in (_handed("codec_max_frame_length"), os.environ.get(_ENV["codec_max_frame_length"], "").strip()):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return MAX_FRAME_LENGTH
