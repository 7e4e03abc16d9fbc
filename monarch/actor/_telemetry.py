"""What a client records: its ``<root>`` actor, the meshes it makes, the messages it casts.

Rows go into the process's :class:`~monarch_telemetry.recorder.Recorder` and are pushed, a
few times a second and once more at exit, to the host agent of the first host it spawned
procs on, where ``monarch query`` finds them.  Ids are hashes of names, the same ones
proc agents use (see ``monarch_agents.actor_telemetry``).
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

from monarch_agents import actor_telemetry
from monarch_agents.context import current
from monarch_agents.messages import TelemetryRows
from monarch_telemetry.recorder import hash_id, recorder, region_json

_lock = threading.Lock()
_root: dict[str, int] = {}  # client address -> its <root> actor id
_sink: str | None = None
_views: dict[int, tuple[Any, str]] = {}  # id(shape) -> (shape, its JSON)


def root_actor(rt: Any) -> int:
    """The id of this client's ``<root>`` actor (recorded once, with its Client status)."""
    rid = _root.get(rt.addr)
    if rid is None:
        with _lock:
            rid = _root.get(rt.addr)
            if rid is None:
                rid = _root[rt.addr] = hash_id(rt.addr)
                rec = recorder()
                rec.actor(rid, rid, 0, rt.addr, "<root>")
                rec.actor_status(rid, "Client")
    return rid


def push_to(rt: Any, host_addr: str) -> None:
    """Push this client's rows to ``host_addr`` from now on (the first host it spawns procs on)."""
    global _sink
    rec = recorder()
    if not rec.on or _sink is not None:
        return
    with _lock:
        if _sink is not None:
            return
        _sink = host_addr

    def send(rows: dict) -> None:
        rt.send(host_addr, TelemetryRows(rows))

    rec.start_flusher(send)
    atexit.register(lambda: rec.flush(send))


def proc_mesh(rt: Any, host_mesh: Any, mesh_id: str, name: str, shape: Any) -> None:
    rec = recorder()
    if not rec.on:
        return
    root_actor(rt)
    hosts = host_mesh.hosts
    if hosts:
        push_to(rt, hosts[0].addr)
    hid = hash_id("hosts:" + ",".join(h.addr for h in hosts))
    hshape = host_mesh._shape
    rec.mesh(hid, "Host", "hosts", "hosts:" + ",".join(h.host for h in hosts), hshape.labels, hshape.sizes)
    rec.mesh(hash_id(mesh_id), "Proc", name, mesh_id, shape.labels, shape.sizes, hid, hshape.labels, hshape.sizes,
             hshape.indices)


def actor_mesh(rt: Any, proc_mesh_: Any, actor_id: str, name: str, cls: type, shape: Any) -> None:
    rec = recorder()
    if rec.on:
        root_actor(rt)
        pshape = proc_mesh_._shape
        rec.mesh(hash_id(actor_id), f"Python<{cls.__name__}>", name, actor_id, shape.labels, shape.sizes,
                 hash_id(proc_mesh_._mesh_id), pshape.labels, pshape.sizes, pshape.indices)


_casts: dict[tuple, tuple] = {}  # (id(mesh), id(shape), broadcast) -> (mesh, shape, row values)


def sent(rt: Any, mesh: Any, endpoint: str, shape: Any, reply: Any) -> None:
    """One cast to (a slice of) an actor mesh (hot path: one dict lookup and one append)."""
    rec = recorder()
    if not rec.on:
        return
    key = (id(mesh), id(shape), reply is None)
    hit = _casts.get(key)
    if hit is None or hit[0] is not mesh or hit[1] is not shape:
        full = mesh._shape
        n = len(shape)
        adverb = "broadcast" if reply is None else ("call" if n == len(full) and n != 1 else
                                                     ("call_one" if len(full) == 1 else "choose"))
        if len(_casts) > 10_000:
            _casts.clear()
        # Monarch's shape_json is the view's shape, as its view_json (a Shape converted from the Region).
        view = _json(shape)
        hit = _casts[key] = (mesh, shape, (root_actor(rt), _mesh_id(mesh), view, view,
                                           adverb, n))
    sender, mesh_id, view, full_json, adverb, n = hit[2]
    # Sent from inside an actor: that actor is the sender (Monarch's sender_actor_id), not the proc's root.
    info = current().actor
    if info is not None and info.slot is not None:
        sender = actor_telemetry.actor_id(info.slot)
    rec.sent(sender, mesh_id, view, full_json, endpoint, adverb, n)


def _mesh_id(mesh: Any) -> int:
    mid = mesh.__dict__.get("_telemetry_id")
    if mid is None:
        mid = mesh.__dict__["_telemetry_id"] = hash_id(mesh._actor_id)
    return mid


def _json(shape: Any) -> str:
    """A view of a mesh as Monarch serializes its region (``monarch_telemetry.recorder.region_json``)."""
    hit = _views.get(id(shape))
    if hit is not None and hit[0] is shape:
        return hit[1]
    text = region_json(shape.labels, shape.sizes, shape.indices)
    if len(_views) > 10_000:
        _views.clear()
    _views[id(shape)] = (shape, text)
    return text
