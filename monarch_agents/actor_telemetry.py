"""What a proc agent records about its actors and the messages they handle.

Rows go into this process's :class:`~monarch_telemetry.recorder.Recorder` (one append per
handled message) and are pushed to the proc's host agent a few times a second, and once
more when the proc stops.  What Python code in the proc prints is recorded as ``logs``
rows too.  A proc killed outright loses the rows of its last fraction of a second.

Ids: an actor is ``hash_id("<actor mesh id>[<rank>]")``, its mesh ``hash_id("<actor mesh id>")``,
the sender of a message ``hash_id(<its address>)`` (the client's ``<root>`` actor), the same
as the client records them, so rows from every process join.
"""

from __future__ import annotations

import os
import time
from typing import Any

from monarch_agents import messages as m
from monarch_agents import names
from monarch_telemetry.recorder import Recorder, hash_id, install, tee_stdio

rec: Recorder | None = None
_send: Any = None
_senders: dict[str, int] = {}
#: ``messages.port_index``: as Monarch's, the port of the receiving actor the message was delivered
#: to, scoped by the actor; an actor here has one port per endpoint, named by the endpoint.
_ports: dict[str, int] = {}
#: This proc's address and name, for its actors' Monarch addresses (``actors.full_name``).
_proc: tuple[str, str] = ("", "")


def start(rt: Any, config: dict) -> None:
    """Record in this proc and push to its host agent (``config`` is the proc's start config)."""
    global rec, _send, _proc
    rec = install(Recorder(config["host"]))
    _proc = (rt.addr, names.proc_name(config["host"], os.getpid()))
    if not rec.on:
        return
    host_agent = config["host_agent"]
    _send = lambda rows: rt.send(host_agent, m.TelemetryRows(rows))  # noqa: E731
    rec.start_flusher(_send)
    tee_stdio(rec, f"{config['mesh_id']}/{os.getpid()}")


def stop() -> None:
    """Push what is left (the proc is stopping)."""
    if rec is not None and rec.on and _send is not None:
        rec.stop()
        rec.flush(_send)


def actor_id(slot: Any) -> int:
    """The telemetry id (``actors.id``) of the actor an actor slot holds."""
    tid = getattr(slot, "_telemetry_id", None)
    if tid is None:
        tid = slot._telemetry_id = hash_id(f"{slot.msg.actor_id}[{_rank(slot)}]")
    return tid


def _rank(slot: Any) -> int:
    info = getattr(slot, "info", None)
    if info is not None:
        return info.rank
    r = 0
    for k, size in slot.msg.extent.items():
        r = r * size + slot.msg.point.get(k, 0)
    return r


def created(slot: Any) -> None:
    """An actor slot was made: its ``actors`` row and its Created status."""
    if rec is not None and rec.on:
        msg = slot.msg
        rank = _rank(slot)
        ours = f"{msg.actor_id}[{rank}]"
        rec.actor(actor_id(slot), hash_id(msg.actor_id), rank, names.actor_addr(_proc[0], _proc[1], ours),
                  f"{msg.name}[{rank}]", ours)
        rec.actor_status(actor_id(slot), "Created")


def ready(slot: Any) -> None:
    """An actor's ``__init__`` returned: its Idle status, and its rows pushed now rather than with the
    next periodic flush, so that they reach its host before its spawn is answered (the mesh admin API
    and ``monarch query`` then list every actor whose spawn has returned)."""
    if rec is not None and rec.on:
        rec.actor_status(actor_id(slot), "Idle")
        if _send is not None:
            rec.flush(_send)


def status(slot: Any, new_status: str, reason: str | None = None) -> None:
    if rec is not None and rec.on:
        rec.actor_status(actor_id(slot), new_status, reason)


def arrived(call: Any) -> None:
    """A call reached this proc (on the IO thread): its queued time."""
    if rec is not None and rec.on:
        call._queued_us = time.time_ns() // 1000


def begin() -> int:
    """The time a handler starts (0 when not recording)."""
    return time.time_ns() // 1000 if rec is not None and rec.on else 0


def handled(slot: Any, call: Any, active_us: int, ok: bool) -> None:
    """A handler finished: one row for ``messages`` and ``message_status_events``."""
    if not active_us or rec is None:
        return
    sender = _senders.get(call.sender)
    if sender is None:
        sender = _senders[call.sender] = hash_id(call.sender)
    port = _ports.get(call.method)
    if port is None:
        port = _ports[call.method] = hash_id(f"port:{call.method}")
    rec.message(rec.new_id(), getattr(call, "_queued_us", active_us), active_us, time.time_ns() // 1000, sender,
                actor_id(slot), call.method, port, ok)
