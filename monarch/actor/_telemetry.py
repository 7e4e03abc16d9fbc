"""What a client records: its ``<root>`` actor, the meshes it makes, the messages it casts.

A client may hold meshes of several jobs (one runtime per job, ``monarch_agents.client``), and each
job's telemetry is its own host agents' tables: so each job gets its own rows.  What belongs to a
job (its ``<root>`` actor, its meshes, the casts to them) goes into a :class:`Recorder` of that
job's runtime and is pushed only to that job; what belongs to the process (spans, metrics and log
lines the client records outside any job, in ``monarch_telemetry.recorder.recorder()``) is pushed to
every job it holds then.  One thread pushes, a few times a second and once more at exit, to the
host agent of the first host of each job (set by :func:`push_to`: the job's telemetry service
start, else its first ``spawn_procs``), where ``monarch query`` finds them.  Ids are hashes of names,
the same ones proc agents use (see ``monarch_agents.actor_telemetry``).

Inside a proc (an actor that spawns meshes) everything goes into the proc's own recorder, which
its proc agent pushes to its host.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Any, Callable

from monarch_agents import actor_telemetry, names
from monarch_agents.context import current
from monarch_agents.messages import TelemetryRows
from monarch_telemetry.recorder import FLUSH_INTERVAL_S, Recorder, hash_id, log, recorder, region_json

_lock = threading.Lock()
_root: dict[str, int] = {}  # client address -> its <root> actor id
_views: dict[int, tuple[Any, str]] = {}  # id(shape) -> (shape, its JSON)
_host_meshes: set[tuple[str, int]] = set()  # (client address, host mesh id) recorded, with their agents


@dataclass
class _Job:
    """One runtime's (one job's) rows and where they go."""

    rt: Any
    rec: Recorder
    send: Callable[[dict], None] | None = None


#: This client's jobs, by their runtime's address.
_jobs: dict[str, _Job] = {}
#: The pushing thread and what stops it (one at a time: :func:`stop`, or no open job left, ends it).
_flusher: tuple[threading.Thread, threading.Event] | None = None


def _in_proc() -> bool:
    return actor_telemetry.rec is not None


def job_recorder(rt: Any) -> Recorder:
    """Where rows of ``rt``'s job go: its own recorder in a client, the proc's recorder in a proc."""
    job = _jobs.get(rt.addr)
    if job is not None and job.rt is rt:
        return job.rec
    shared = recorder()
    if _in_proc() or not shared.on:
        return shared
    with _lock:
        job = _jobs.get(rt.addr)
        if job is None or job.rt is not rt:  # (an address a closed runtime had: a new job)
            job = _jobs[rt.addr] = _Job(rt, Recorder(shared.host, enabled=True))
        return job.rec


def root_actor(rt: Any) -> int:
    """The id of this client's ``<root>`` actor in ``rt``'s job (recorded once, with its Client status)."""
    rid = _root.get(rt.addr)
    if rid is None:
        rec = job_recorder(rt)
        with _lock:
            rid = _root.get(rt.addr)
            if rid is None:
                rid = _root[rt.addr] = hash_id(rt.addr)
                rec.actor(rid, rid, 0, names.actor_addr(rt.addr, "local", "client"), "<root>", rt.addr)
                rec.actor_status(rid, "Client")
    return rid


def bounced(rt: Any) -> None:
    """A message this client sent came back undelivered (its actor stopped, its proc died): the
    client's ``<root>`` actor handles that, as Monarch's root handles an undeliverable message, so
    its status is ``Processing`` (Monarch's status of an actor handling a message)."""
    if _in_proc() or current().actor is not None:
        return  # an actor's own statuses are its proc agent's
    rec = job_recorder(rt)
    if rec.on:
        rec.actor_status(root_actor(rt), "Processing")


def push_to(rt: Any, host_addr: str) -> None:
    """Push the rows of ``rt``'s job to ``host_addr`` from now on (a host of that job), and this
    process's own rows there too; a job's first call decides."""
    global _flusher
    if not recorder().on or _in_proc():
        return
    job_recorder(rt)
    with _lock:
        job = _jobs[rt.addr]
        if job.send is not None:
            return
        job.send = lambda rows: rt.send(host_addr, TelemetryRows(rows))
        if _flusher is None:
            stop_event = threading.Event()
            thread = threading.Thread(target=_flush_loop, args=(stop_event,), name="telemetry-flush", daemon=True)
            _flusher = (thread, stop_event)
            thread.start()
            atexit.register(flush)


def _flush_loop(stop_event: threading.Event) -> None:
    """Push every FLUSH_INTERVAL_S until stopped, or until every job it pushed to was closed (a
    client that closed its runtimes without :func:`stop` keeps no thread); a later job starts another."""
    global _flusher
    while not stop_event.wait(FLUSH_INTERVAL_S):
        flush()
        with _lock:
            if all(j.rt.closed for j in _jobs.values() if j.send is not None):
                if _flusher is not None and _flusher[1] is stop_event:
                    _flusher = None
                return


def stop(timeout: float = 2.0) -> None:
    """Push what is left and end the pushing thread, joined by ``timeout`` (before the runtimes
    close: the rows recorded since the last push still reach their jobs)."""
    global _flusher
    with _lock:
        flusher, _flusher = _flusher, None
    if flusher is None:
        return
    thread, stop_event = flusher
    stop_event.set()
    if thread is not threading.current_thread():
        thread.join(timeout)
    flush()


def flush() -> None:
    """Push what was recorded since the last push: each job's rows to it, this process's to every job."""
    with _lock:
        jobs = [(j, j.send) for j in _jobs.values() if j.send is not None]
    shared = recorder().take() if jobs else {}
    for job, send in jobs:
        if job.rt.closed:
            continue  # its runtime was closed: nothing reaches its hosts any more
        for rows in (job.rec.take(), shared):
            if rows:
                try:
                    send(rows)
                except Exception as e:  # that job's host agent is gone: these rows have nowhere to go
                    log.debug("telemetry rows dropped: %s", e)


def proc_mesh(rt: Any, host_mesh: Any, mesh_id: str, name: str, shape: Any, procs: Any = ()) -> None:
    """A proc mesh made on ``host_mesh``: its row (and its host mesh's, once per job), and one
    ``actors`` row per agent as Monarch has: each host's host agent in the host mesh (its rank
    there) and each proc's proc agent in the proc mesh (``procs``: ProcInfo in rank order), both
    real here (the process that starts and serves procs; the one that runs a proc's actors). Their
    ``display_name`` and ``ref_name`` are NULL: system actors, not listed among a program's own."""
    if not recorder().on:
        return
    rec = job_recorder(rt)
    root_actor(rt)
    hosts = host_mesh.hosts
    if hosts:
        push_to(rt, hosts[0].addr)
    hid = hash_id("hosts:" + ",".join(h.addr for h in hosts))
    hshape = host_mesh._shape
    with _lock:
        first = (rt.addr, hid) not in _host_meshes
        _host_meshes.add((rt.addr, hid))
    if first:
        rec.mesh(hid, "Host", "hosts", "hosts:" + ",".join(h.host for h in hosts), hshape.labels, hshape.sizes)
        for rank, h in enumerate(hosts):
            rec.actor(hash_id(f"host_agent:{h.addr}"), hid, rank, names.actor_addr(h.addr, h.host, "host_agent"),
                      None, None, host=h.host, pid=None)
    pmid = hash_id(mesh_id)
    rec.mesh(pmid, "Proc", name, mesh_id, shape.labels, shape.sizes, hid, hshape.labels, hshape.sizes,
             hshape.indices)
    for rank, p in enumerate(procs):
        rec.actor(hash_id(f"proc_agent:{p.addr}"), pmid, rank,
                  names.actor_addr(p.addr, names.proc_name(p.host, p.pid), "proc_agent"), None, None,
                  host=p.host, pid=p.pid)


def actor_mesh(rt: Any, proc_mesh_: Any, actor_id: str, name: str, cls: type, shape: Any) -> None:
    if recorder().on:
        rec = job_recorder(rt)
        root_actor(rt)
        pshape = proc_mesh_._shape
        rec.mesh(hash_id(actor_id), f"Python<{cls.__name__}>", name, actor_id, shape.labels, shape.sizes,
                 hash_id(proc_mesh_._mesh_id), pshape.labels, pshape.sizes, pshape.indices)


_casts: dict[tuple, tuple] = {}  # (id(mesh), id(shape), broadcast) -> (mesh, shape, row values, recorder)


def sent(rt: Any, mesh: Any, endpoint: str, shape: Any, reply: Any) -> None:
    """One cast to (a slice of) an actor mesh (hot path: one dict lookup and one append)."""
    if not recorder().on:
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
                                           adverb, n), job_recorder(rt))
    sender, mesh_id, view, full_json, adverb, n = hit[2]
    # Sent from inside an actor: that actor is the sender (Monarch's sender_actor_id), not the proc's root.
    info = current().actor
    if info is not None and info.slot is not None:
        sender = actor_telemetry.actor_id(info.slot)
    hit[3].sent(sender, mesh_id, view, full_json, endpoint, adverb, n)


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
