"""monarch.config: the runtime settings of this process, as PyTorch Monarch's ``monarch.config``.

    from monarch.config import configure, configured, get_global_config

    configure(mesh_proc_spawn_max_idle="5m")           # procs may take 5 minutes to start
    with configured(stop_actor_timeout="30s"):         # for this block only
        ...
    get_global_config()["mesh_proc_spawn_max_idle"]   # '5m'

Layers, lowest first: defaults, environment variables, then what ``configure`` set (the
"runtime" layer).  Durations take humantime strings ("30s", "5m", "1h 30m", "250ms") or seconds,
in ``configure`` and in the environment alike.  What a setting governs reads it through
:func:`seconds` when it needs it: the one path, so a setting changed later applies to what comes
after, and nothing here writes into other modules.

The settings are the ones monarch has, under Monarch's name where one means the same thing:

==============================  =========================================  =============================
setting                         what                                       environment
==============================  =========================================  =============================
``mesh_proc_spawn_max_idle``    how long ``spawn_procs`` waits for a host  ``MONARCH_SPAWN_TIMEOUT`` (s)
``stop_actor_timeout``          how long stopping a proc waits for it      -
``port_forward_connect_timeout`` how long a forwarded connection waits      -
                                for its destination (monarch's own)
``serve_agent_start_max_idle``   how long ``monarch serve`` waits, its job  ``MONARCH_SERVE_STALL_TIMEOUT``
                                running, with no new host agent up          (s)
                                (monarch's own)
==============================  =========================================  =============================

Another of Monarch's settings raises ``ValueError`` naming the ones there are.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass(frozen=True)
class _Setting:
    default: str
    env: str
    doc: str


_SETTINGS: dict[str, _Setting] = {
    "mesh_proc_spawn_max_idle": _Setting("120s", "MONARCH_SPAWN_TIMEOUT",
                                         "how long spawn_procs waits for a host to start its procs"),
    "stop_actor_timeout": _Setting("5s", "", "how long stopping a proc mesh waits for each proc"),
    "port_forward_connect_timeout": _Setting("10s", "", "how long a forwarded connection waits for its destination"),
    "serve_agent_start_max_idle": _Setting("300s", "MONARCH_SERVE_STALL_TIMEOUT",
                                          "how long serve waits, its job running, with no new host agent up"),
}

_runtime: dict[str, str] = {}
_lock = threading.RLock()
_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")


def parse_duration(value: Any) -> float:
    """Seconds in ``value``: a number, or a humantime string such as "30s", "5m", "1h 30m", "250ms"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if not parts or _PART.sub("", text).strip() or any(u not in _UNITS for _, u in parts):
                raise ValueError(f"bad duration {value!r}: use e.g. '30s', '5m', '1h 30m' or '250ms'") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"bad duration {value!r}: use e.g. '30s', '5m', '1h 30m' or '250ms'")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds


def _check(key: str) -> _Setting:
    setting = _SETTINGS.get(key)
    if setting is None:
        raise ValueError(f"monarch has no setting {key!r}; it has: {', '.join(sorted(_SETTINGS))}")
    return setting


def _effective(key: str) -> str:
    if key in _runtime:
        return _runtime[key]
    setting = _SETTINGS[key]
    env = os.environ.get(setting.env) if setting.env else None
    if env:
        return env if not _is_number(env) else f"{env}s"
    return setting.default


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def seconds(key: str) -> float:
    """The setting ``key`` as it applies now, in seconds (what the code a setting governs reads).

    A bad value in the environment (``MONARCH_SPAWN_TIMEOUT=soon``) raises ``ValueError`` here, when
    it is used, naming the forms a duration takes; it never breaks an import."""
    _check(key)
    with _lock:
        return parse_duration(_effective(key))


def configure(**kwargs: Any) -> None:
    """Set runtime settings for this process (see the module docstring for the names)."""
    with _lock:
        checked = {}
        for key, value in kwargs.items():
            _check(key)
            parse_duration(value)  # a bad value changes nothing
            checked[key] = value if isinstance(value, str) else f"{float(value):g}s"
        _runtime.update(checked)


def get_global_config() -> dict[str, Any]:
    """Every setting as it applies now: defaults, then the environment, then ``configure``."""
    with _lock:
        return {key: _effective(key) for key in _SETTINGS}


def get_runtime_config() -> dict[str, Any]:
    """Only what ``configure`` set."""
    with _lock:
        return dict(_runtime)


def clear_runtime_config() -> None:
    """Forget what ``configure`` set (the environment and defaults apply again)."""
    with _lock:
        _runtime.clear()


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[dict[str, Any]]:
    """Apply ``overrides`` for the block and yield the merged settings; the previous runtime
    settings come back afterwards (for the whole process: other threads see them too)."""
    with _lock:
        previous = get_runtime_config()
        configure(**overrides)
    try:
        yield get_global_config()
    finally:
        with _lock:
            clear_runtime_config()
            configure(**previous)


__all__ = ["clear_runtime_config", "configure", "configured", "get_global_config", "get_runtime_config",
           "parse_duration", "seconds"]
