"""Names that arrive in messages and become file names (run ids, mesh ids).

A peer chooses them, so they are made safe before they touch a path: one path
component, never ``..``, nothing outside ``[A-Za-z0-9._-]``.
"""

from __future__ import annotations

import os
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX = 128


def path_component(name: str) -> str:
    """``name`` as one safe file name: unsafe characters become ``_``; never empty, ``.``/``..`` or hidden."""
    safe = _UNSAFE.sub("_", str(name))[:_MAX]
    if not safe or safe.startswith("."):
        safe = "_" + safe
    return safe


def location(addr: str) -> str:
    """How Monarch prints a channel address inside an actor or proc id: ``scheme://rest`` (its
    ``local:N`` is ``inproc://N``); an address of ours is already in that form."""
    scheme, sep, rest = addr.partition(":")
    if not sep or rest.startswith("//"):
        return addr
    return f"inproc://{rest}" if scheme == "local" else f"{scheme}://{rest}"


def actor_addr(addr: str, proc_name: str, actor_name: str) -> str:
    """An actor's address as Monarch prints one (``actor.proc@location``): what
    ``monarch.actor.ActorAddr`` prints and reads back, and ``actors.full_name`` in telemetry."""
    return f"{actor_name}.{proc_name}@{location(addr)}"


def proc_name(host: str, pid: int) -> str:
    """A proc's name in an actor address: its host and pid (the client's own is ``local``)."""
    return f"{host}-{pid}"


def open_private(path: str, mode: str = "ab"):
    """Open ``path`` for writing, creating it with mode 0600 (run logs may hold secrets)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    return open(os.open(path, flags, 0o600), mode)
