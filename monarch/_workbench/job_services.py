"""A job's telemetry and admin services, as Monarch's ``enable_telemetry`` / ``enable_admin`` give them.

Both are HTTP servers this client runs on loopback (unless ``MeshAdminConfig(admin_addr=...)``, or
for the admin server ``monarch.config``'s ``mesh_admin_addr``, says otherwise) for as long as it holds the job:

* telemetry (``JobState.telemetry_url``): ``POST /api/query`` ``{"sql": ...}`` answers
  ``{"rows": [...]}`` from the job's telemetry tables (the SQL of ``monarch query``, run on every
  host); ``JobState.query_engine_client.query(sql)`` asks it from Python (``JobState.query_engine`` is
  None, as Monarch's; ``QueryEngine(hosts).query(sql)`` runs the same in process, a ``pyarrow`` reader).
* admin (``JobState.admin_url``): Monarch's mesh admin API, a tree of references to walk from
  ``GET /v1/root`` (hosts, then procs, then actors, each ``GET /v1/{reference}``), ``GET
  /v1/pyspy/{proc}`` (the proc's Python stacks by ``monarch stack``'s py-spy), ``GET /v1/tree``,
  ``GET /v1/admin``, ``POST /v1/query``, JSON Schemas under ``/v1/schema``, ``GET
  /v1/openapi.json`` and ``GET /SKILL.md`` (``admin_api.py``); of a proc, ``GET /v1/config/{proc}``
  (its settings, asked of the proc: ``ConfigDump``), ``POST /v1/pyspy_dump/{proc}`` (its stacks,
  kept by its host under a ``dump_id``: the ``pyspy_*`` views) and ``POST
  /v1/pyspy_profile_svg/{proc}`` (``py-spy record`` on its host: ``ProfileProc``).  Errors are
  ``{"error": {"code": "not_found" | "bad_request" | "gateway_timeout" | "service_unavailable" |
  "internal_error", "message": ...}}``, with Monarch's HTTP statuses (404, 400, 504, 503, 500).  The tree is read from the telemetry tables (``hosts``, ``procs``,
  ``actors``, ``actor_status_events``, ``messages``), so it shows what they recorded.

References are opaque strings (``root``, ``host:NAME``, ``proc:NAME/PID``,
``actor:NAME/PID,ACTOR``): round-trip them, percent-encoded in the URL path.  An actor's name is
its reference's last comma-separated part, where Monarch's admin tools look for it (its
``verify_pyspy`` finds a workload's procs by their actors' names so); ``actor:NAME/PID/ACTOR``, the
form before, is still resolved.

Who is answered: the owner's processes on this machine (the peer's uid, from the kernel's
``/proc/net/tcp``); another user's get a 403 line.  A server bound beyond loopback (asked for with
``admin_addr``, to be reached from other machines, whose peers' uids cannot be told) answers those
only with its bearer token (``Authorization: Bearer TOKEN``, else a 401 line): a random token made
per server, in a 0600 file of the user's runtime folder named by ``JobServer.token_file`` (and
said on stderr, and by ``_spawn_admin`` on stdout), removed when the server closes.  Monarch's OSS
admin server falls back to plain HTTP with no check at all; its Meta build requires mutual TLS.
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import weakref
from dataclasses import dataclass
from types import SimpleNamespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from monarch_agents.unproven import UnprovenConnections, local_peer_uid

log = logging.getLogger("monarch.telemetry")

DEFAULT_QUERY_TIMEOUT_S = 10.0
#: Connections to a job's HTTP server that have not sent a whole request yet, at most: one more
#: closes the oldest of them, so another local user's idle connections hold neither the server's
#: descriptors nor a thread each, and a client that sends its request at once is still served.
UNREAD_MAX = 32
#: How long a connection to it may stay silent (for its request; then each read or write).
REQUEST_S = 10.0


@dataclass
class _Hosts:
    """What the telemetry fan-out needs of a job: its hosts (addr, host, host_rank), runtime and
    spec (its scheduler says how the hosts are reached: ``monarch._workbench.hosts``)."""

    hosts: list
    rt: Any
    spec: Any = None
    #: The address of the user's shared host agent, if this client uses one (``monarch.actor._client``):
    #: that agent's procs are every script's, and the admin tree shows only this client's.
    shared_addr: str | None = None

    def __post_init__(self) -> None:
        if self.spec is None:
            self.spec = SimpleNamespace(scheduler="")  # meshes of no reservation: the agents' tree

    def runtime(self) -> Any:
        return self.rt


def hosts_of(meshes: dict[str, Any], record: Any = None) -> _Hosts:
    """Every host of a job's host meshes, once each (``record``: the job's reservation, if any)."""
    seen: dict[str, Any] = {}
    rt = None
    for mesh in meshes.values():
        rt = rt or mesh._rt()
        for h in mesh._hosts:
            seen.setdefault(h.addr, h)
    return _Hosts(sorted(seen.values(), key=lambda h: h.host_rank), rt, getattr(record, "spec", None))


def run_query(hosts: _Hosts, sql: str, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S) -> Any:
    """``sql`` over the job's hosts, within ``timeout_s``; the hosts' scans are waited for as long as
    Monarch waits for its worker collectors' (``monarch._src.job.telemetry_actor._SCAN_WORKER_TIMEOUT_SECS``,
    read at each query), a host slower than that left out of the answer."""
    from monarch._src.job import telemetry_actor
    from monarch._workbench.telemetry import query

    scan_s = float(telemetry_actor._SCAN_WORKER_TIMEOUT_SECS)
    return query(hosts, sql, timeout_s=timeout_s, host_timeout_s=scan_s).table  # type: ignore[arg-type]


class QueryEngine:
    """The job's telemetry in this process: ``query(sql)`` returns a ``pyarrow.RecordBatchReader``."""

    def __init__(self, hosts: _Hosts):
        self._hosts = hosts

    def query(self, sql: str) -> Any:
        return run_query(self._hosts, sql).to_reader()

    def __repr__(self) -> str:
        return f"QueryEngine({len(self._hosts.hosts)} hosts)"


class QueryEngineClient:
    """A client of a job's telemetry service (``telemetry_url``): ``query(sql)`` -> ``{"rows": [...]}``."""

    def __init__(self, base_url: str, timeout: float = DEFAULT_QUERY_TIMEOUT_S):
        self._base_url = base_url.rstrip("/")
        self._timeout = timeout
        # No proxy: the service listens on loopback, where a proxy from the environment would fail.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def base_url(self) -> str:
        return self._base_url

    def store_pyspy_dump(self, dump_id: str, proc_ref: str, pyspy_result_json: str) -> dict[str, Any]:
        """Keep a py-spy result (Monarch's ``PySpyResult`` JSON) in the job's telemetry under ``dump_id``;
        ``pyspy_dumps``, ``pyspy_frames`` and ``pyspy_local_variables`` then show it."""
        body = {"dump_id": dump_id, "proc_ref": proc_ref, "pyspy_result_json": pyspy_result_json}
        req = urllib.request.Request(f"{self._base_url}/api/pyspy_dump", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with self._opener.open(req, timeout=self._timeout) as resp:
            return json.loads(resp.read())

    def query(self, sql: str, timeout: float | None = None) -> dict[str, Any]:
        req = urllib.request.Request(f"{self._base_url}/api/query", data=json.dumps({"sql": sql}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with self._opener.open(req, timeout=self._timeout if timeout is None else timeout) as r:
                result = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")
            raise urllib.error.HTTPError(e.url, e.code, f"{e.reason}: {body}", e.headers, None) from None
        if not isinstance(result, dict) or not isinstance(result.get("rows"), list):
            raise RuntimeError(f"invalid telemetry query response: {result!r}")
        return result


# -- the admin tree ---------------------------------------------------------------------------------


def _iso(us: Any) -> str | None:
    if us is None:
        return None
    if isinstance(us, datetime.datetime):
        return us.astimezone(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    return datetime.datetime.fromtimestamp(int(us) / 1e6, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _now() -> str:
    return _iso(time.time() * 1e6) or ""


class NotFound(Exception):
    pass


class BadRequest(Exception):
    pass


class Unavailable(Exception):
    """A tool the answer needs is missing where it runs (py-spy): 503, ``service_unavailable``."""


class Failed(Exception):
    """The work ran and failed (py-spy could not read the proc): 500, ``internal_error``."""


def _spawner_pid(mesh: str) -> int | None:
    """The pid of the process that spawned proc mesh ``mesh`` (its id is ``NAME-PID-N-HEX``,
    ``monarch.actor._mesh``), or None for an id of another form."""
    parts = (mesh or "").rsplit("-", 3)
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


def _family(procs: list[dict], client_pid: int) -> list[dict]:
    """The procs of ``procs`` (rows with ``pid`` and ``mesh``) that this client spawned, or that
    its procs spawned, at any depth: Monarch's client owns its host, so its admin tree shows no
    other program's procs, while the shared agent's tables hold every script's."""
    ours, grew = {client_pid}, True
    while grew:
        grew = False
        for p in procs:
            if p["pid"] not in ours and _spawner_pid(p["mesh"]) in ours:
                ours.add(p["pid"])
                grew = True
    return [p for p in procs if p["pid"] in ours and p["pid"] != client_pid]


def proc_of(ref: str) -> tuple[str, int]:
    """(host, pid) of a proc reference ``proc:HOST/PID``, or BadRequest."""
    kind, _, rest = ref.partition(":")
    host, _, pid = rest.rpartition("/")
    if kind != "proc" or not host or not pid.isdigit():
        raise BadRequest(f"invalid proc reference {ref!r}: expected proc:HOST/PID (a child of a host node)")
    return host, int(pid)


def _seconds(key: str) -> float:
    from monarch import config

    return config.seconds(key)


class AdminTree:
    """Resolves admin references from the telemetry tables of a job."""

    def __init__(self, hosts: _Hosts, started_at: str):
        self.hosts = hosts
        self.started_at = started_at
        self._local = threading.local()  # per request: the deadline of a whole tree

    def _rows(self, sql: str) -> list[dict]:
        deadline = getattr(self._local, "deadline", None)  # a whole tree's (mesh_admin_tree_timeout)
        if deadline is None:
            return run_query(self.hosts, sql).to_pylist()
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the tree took longer than mesh_admin_tree_timeout")
        return run_query(self.hosts, sql, timeout_s=min(DEFAULT_QUERY_TIMEOUT_S, left)).to_pylist()

    def resolve(self, ref: str) -> dict:
        if ref == "root":
            return self._root()
        kind, _, rest = ref.partition(":")
        if kind == "host" and rest:
            return self._host(rest)
        if kind == "proc" and "/" in rest:
            host, _, pid = rest.rpartition("/")
            if pid.isdigit():
                return self._proc(host, int(pid))
        if kind == "actor" and "," in rest:
            where, _, name = rest.partition(",")
            host, _, pid = where.rpartition("/")
            if host and pid.isdigit():
                return self._actor(host, int(pid), name)
        if kind == "actor" and rest.count("/") >= 2:  # the form before (actor:HOST/PID/NAME)
            host, pid, name = rest.split("/", 2)
            if pid.isdigit():
                return self._actor(host, int(pid), name)
        raise NotFound(f"no node {ref!r} (references come from /v1/root and its children)")

    def _payload(self, ref: str, props: dict, children: list[str], parent: str | None) -> dict:
        return {"identity": ref, "properties": props, "children": children, "parent": parent, "as_of": _now()}

    def _host_names(self) -> list[str]:
        return [h.host for h in self.hosts.hosts]

    def _root(self) -> dict:
        names = self._host_names()
        props = {"Root": {"num_hosts": len(names), "started_at": self.started_at,
                          "started_by": f"{getpass.getuser()}@{socket.gethostname()}", "system_children": []}}
        return self._payload("root", props, [f"host:{n}" for n in names], None)

    def _host(self, name: str) -> dict:
        if name not in self._host_names():
            raise NotFound(f"no host {name!r}")
        info = self._rows(f"SELECT addr, agent_rss_bytes FROM hosts WHERE host = '{_q(name)}'")
        procs = self._rows(f"SELECT pid, mesh FROM procs WHERE kind = 'proc' AND host = '{_q(name)}' ORDER BY started")
        if self._is_shared_local(name):
            procs = _family(procs, os.getpid())
        addr = info[0]["addr"] if info else next(h.addr for h in self.hosts.hosts if h.host == name)
        rss = info[0]["agent_rss_bytes"] if info else None
        props = {"Host": {"addr": addr, "num_procs": len(procs), "system_children": [],
                          "memory": {"process_rss_bytes": rss, "process_vm_size_bytes": None}}}
        return self._payload(f"host:{name}", props, [f"proc:{name}/{p['pid']}" for p in procs], "root")

    def _is_shared_local(self, name: str) -> bool:
        """Whether host ``name`` is this machine's shared host agent (``monarch_agents.local_agent``),
        which serves every script of the user: its procs are not all this client's."""
        shared = self.hosts.shared_addr
        return shared is not None and any(h.host == name and h.addr == shared for h in self.hosts.hosts)

    def _actor_rows(self, host: str, pid: int) -> list[dict]:
        return self._rows(
            "SELECT a.id, a.ref_name AS full_name, a.display_name, a.timestamp_us, m.class AS class, "
            "s.new_status AS status, s.reason AS reason, s.timestamp_us AS status_us "
            "FROM actors_ext a LEFT JOIN meshes m ON a.mesh_id = m.id "
            "LEFT JOIN (SELECT actor_id, new_status, reason, timestamp_us, row_number() OVER "
            "(PARTITION BY actor_id ORDER BY timestamp_us DESC) AS n FROM actor_status_events) s "
            f"ON s.actor_id = a.id AND s.n = 1 WHERE a.host = '{_q(host)}' AND a.pid = {int(pid)} "
            "AND a.ref_name IS NOT NULL "  # (an agent's row: a system actor, not the program's)
            "ORDER BY a.timestamp_us")

    def _proc(self, host: str, pid: int) -> dict:
        procs = self._rows(f"SELECT mesh, status, rss_bytes FROM procs WHERE kind = 'proc' AND host = '{_q(host)}' "
                           f"AND pid = {int(pid)}")
        if not procs:
            raise NotFound(f"no proc {pid} on host {host!r}")
        p = procs[0]
        actors = self._actor_rows(host, pid)
        live, stopped, failed = [], [], 0
        for a in actors:
            ref = f"actor:{host}/{pid},{a['full_name']}"
            status = (a["status"] or "").lower()
            (stopped if status in ("stopped", "failed") else live).append(ref)
            failed += status == "failed"
        props = {"Proc": {"proc_name": f"{p['mesh']}/{pid}", "num_actors": len(live), "system_children": [],
                          "stopped_children": stopped, "stopped_retention_cap": 0,
                          "is_poisoned": failed > 0 or p["status"] in ("failed", "killed"),  # Monarch: a failed actor poisons its proc
                          "failed_actor_count": failed,
                          "debug": {"memory": {"process_rss_bytes": p["rss_bytes"], "process_vm_size_bytes": None},
                                    "actor_work_queue_depth_total": 0, "actor_work_queue_depth_max": 0,
                                    "actor_work_queue_depth_high_water_mark": 0}}}
        return self._payload(f"proc:{host}/{pid}", props, live + stopped, f"host:{host}")

    def _actor(self, host: str, pid: int, name: str) -> dict:
        rows = [a for a in self._actor_rows(host, pid) if a["full_name"] == name]
        if not rows:
            raise NotFound(f"no actor {name!r} in proc {pid} on host {host!r}")
        a = rows[0]
        msgs = self._rows(f"SELECT count(*) AS n, sum(latency_us) AS t FROM messages_ext WHERE to_actor_id = {int(a['id'])}")
        last = self._rows(f"SELECT endpoint FROM messages WHERE to_actor_id = {int(a['id'])} "
                          "ORDER BY timestamp_us DESC LIMIT 1")
        status = (a["status"] or "created").lower()
        shown = f"{status}: {a['reason']}" if a["reason"] and status in ("failed", "stopped") else status
        failure = None
        if status == "failed":
            failure = {"error_message": a["reason"] or "", "root_cause_actor": f"actor:{host}/{pid},{name}",
                       "root_cause_name": a["display_name"], "occurred_at": _iso(a["status_us"]),
                       "is_propagated": False}
        cls = a["class"] or ""
        props = {"Actor": {"actor_status": shown, "actor_type": cls[len("Python<"):-1] if cls.startswith("Python<") else cls,
                           "instance_id": str(a["id"]), "messages_processed": int(msgs[0]["n"] or 0) if msgs else 0,
                           "total_processing_time_us": int(msgs[0]["t"] or 0) if msgs else 0,
                           "created_at": _iso(a["timestamp_us"]), "is_system": False,
                           "last_message_handler": last[0]["endpoint"] if last else None,
                           "failure_info": failure, "flight_recorder": None, "execution": None,
                           "inbound_ordering": None, "queue_depth": 0}}
        return self._payload(f"actor:{host}/{pid},{name}", props, [], f"proc:{host}/{pid}")

    def tree(self) -> str:
        """The whole job as an ASCII tree, within ``mesh_admin_tree_timeout``."""
        self._local.deadline = time.monotonic() + _seconds("mesh_admin_tree_timeout")
        try:
            return self._tree()
        finally:
            self._local.deadline = None

    def _tree(self) -> str:
        lines = ["root"]
        root = self._root()
        for hi, h in enumerate(root["children"]):
            last_h = hi == len(root["children"]) - 1
            lines.append(("└── " if last_h else "├── ") + h)
            for pi, p in enumerate(self._host(h.split(":", 1)[1])["children"]):
                node = self.resolve(p)
                last_p = pi == len(self._host(h.split(":", 1)[1])["children"]) - 1
                pad = "    " if last_h else "│   "
                lines.append(pad + ("└── " if last_p else "├── ") + p)
                for ai, a in enumerate(node["children"]):
                    lines.append(pad + ("    " if last_p else "│   ") +
                                 ("└── " if ai == len(node["children"]) - 1 else "├── ") + a)
        return "\n".join(lines) + "\n"

    def _host_of(self, host: str) -> Any:
        for h in self.hosts.hosts:
            if h.host == host:
                return h
        raise NotFound(f"no host {host!r} in this job")

    def pyspy(self, ref: str, dump_id: str | None = None) -> dict:
        """The proc's Python stacks as Monarch's ``PySpyResult`` (``Ok``, ``BinaryNotFound``, ``Failed``);
        with ``dump_id``, the stack rows its host keeps are marked with it (``pyspy_dumps``)."""
        from monarch._workbench.telemetry import stacks

        host, pid = proc_of(ref)
        target = self._host_of(host)
        result = stacks(self.hosts, hosts=[target], pids=[pid], dump_id=dump_id,  # type: ignore[arg-type]
                        timeout_s=_seconds("mesh_admin_pyspy_bridge_timeout"))
        if result.errors:
            raise TimeoutError(f"host {host!r} gave no stacks: {next(iter(result.errors.values()))}")
        rows = [r for r in result.table.to_pylist() if r["pid"] == pid]
        if not rows:
            raise NotFound(f"no live proc {pid} on host {host!r}")
        errors = [r["error"] for r in rows if r.get("error")]
        if errors:
            if "not installed" in errors[0].lower():
                return {"BinaryNotFound": {"searched": ["py-spy beside the host agent's Python", "py-spy on PATH"]}}
            return {"Failed": {"pid": pid, "binary": "py-spy", "exit_code": None, "stderr": errors[0]}}
        threads: dict[int, dict] = {}
        for r in sorted(rows, key=lambda r: (r["thread_id"], r["depth"])):
            t = threads.setdefault(r["thread_id"], {"pid": pid, "thread_id": r["thread_id"],
                                                    "thread_name": r["thread_name"], "os_thread_id": None,
                                                    "active": True, "owns_gil": False, "frames": []})
            t["frames"].append({"name": r["function"], "filename": r["filename"], "line": r["line"],
                                "is_entry": False, "module": None,
                                "short_filename": os.path.basename(r["filename"] or ""), "locals": None})
        return {"Ok": {"pid": pid, "binary": "py-spy", "capture_mode": "python_only",
                       "stack_traces": list(threads.values()), "warnings": []}}

    def pyspy_dump(self, ref: str) -> dict:
        """Take the proc's stacks and keep them on its host under a new id (``pyspy_dumps``)."""
        dump_id = str(uuid.uuid4())
        result = self.pyspy(ref, dump_id)
        if "BinaryNotFound" in result:
            raise Unavailable("py-spy not available on the proc's host; searched: "
                              + ", ".join(result["BinaryNotFound"]["searched"]))
        if "Failed" in result:
            raise Failed(f"py-spy failed: {result['Failed']['stderr']}")
        return {"dump_id": dump_id}

    def profile_svg(self, ref: str, opts: Any) -> bytes:
        """``py-spy record`` of the proc for ``opts["duration_s"]`` seconds, as an SVG flamegraph."""
        from monarch_agents.messages import ProfileProc

        duration, rate = _profile_opts(opts)
        host, pid = proc_of(ref)
        target = self._host_of(host)
        f = self.hosts.rt.request(target.addr, lambda port: ProfileProc(
            pid, duration, rate, bool(opts["native"]), bool(opts["threads"]), bool(opts["nonblocking"]), port))
        # The host's own limit is the duration plus py-spy's start; wait a little past it.
        try:
            answer = f.get(timeout=duration + _seconds("mesh_admin_pyspy_bridge_timeout"))
        except TimeoutError:
            raise TimeoutError(f"no profile from host {host!r} within the duration and "
                               "mesh_admin_pyspy_bridge_timeout") from None
        if answer.get("svg") is not None:
            return answer["svg"]
        kind, message = answer.get("error"), answer.get("message") or "py-spy record failed"
        raise {"not_found": NotFound, "unavailable": Unavailable, "timeout": TimeoutError}.get(kind, Failed)(message)

    def config(self, ref: str) -> dict:
        """The proc's settings (``monarch.config``), as Monarch's ``ConfigDumpResult``."""
        from monarch import config
        from monarch_agents.messages import ConfigDump, Ping

        host, pid = proc_of(ref)
        target = self._host_of(host)
        timeout = _seconds("mesh_admin_config_dump_bridge_timeout")
        try:
            info = self.hosts.rt.request(target.addr, lambda port: Ping(port)).get(timeout=timeout)
        except TimeoutError:
            raise TimeoutError(f"host {host!r} did not answer within {timeout:g} s") from None
        addr = next((p["addr"] for p in info.procs if p["pid"] == pid and p["addr"]), None)
        if addr is None:
            raise NotFound(f"no live proc {pid} on host {host!r}")
        names = config.env_names()
        try:
            answer = self.hosts.rt.request(addr, lambda port: ConfigDump(names, port)).get(timeout=timeout)
        except TimeoutError:
            raise TimeoutError("timed out waiting for config dump "
                               f"(mesh_admin_config_dump_bridge_timeout, {timeout:g} s)") from None
        return {"entries": config.config_entries(answer.get("env") or {}, answer.get("runtime") or {})}


def _profile_opts(opts: Any) -> tuple[int, int]:
    """(duration_s, rate_hz) of a ``PySpyProfileOpts`` body, checked, or BadRequest."""
    if not isinstance(opts, dict):
        raise BadRequest('expected a JSON object {"duration_s", "rate_hz", "native", "threads", "nonblocking"}')
    missing = [k for k in ("duration_s", "rate_hz", "native", "threads", "nonblocking") if k not in opts]
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    duration, rate = opts["duration_s"], opts["rate_hz"]
    if not isinstance(duration, int) or isinstance(duration, bool) or duration < 1:
        raise BadRequest("duration_s must be positive (whole seconds)")
    longest = _seconds("mesh_admin_pyspy_max_profile_duration")
    if duration > longest:
        raise BadRequest(f"duration_s must be at most {longest:g} (mesh_admin_pyspy_max_profile_duration)")
    if not isinstance(rate, int) or isinstance(rate, bool) or not 1 <= rate <= 1000:
        raise BadRequest("rate_hz must be between 1 and 1000")
    for k in ("native", "threads", "nonblocking"):
        if not isinstance(opts[k], bool):
            raise BadRequest(f"{k} must be true or false")
    return duration, rate


def _q(text: str) -> str:
    return text.replace("'", "''")


# -- schemas (ours, describing what this server answers) ----------------------------------------------

_NODE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://monarch.invalid/v1/schema/node",
    "title": "NodePayload", "type": "object",
    "required": ["identity", "properties", "children", "as_of"],
    "properties": {
        "identity": {"type": "string"},
        "properties": {"type": "object", "minProperties": 1, "maxProperties": 1,
                       "propertyNames": {"enum": ["Root", "Host", "Proc", "Actor", "Error"]}},
        "children": {"type": "array", "items": {"type": "string"}},
        "parent": {"type": ["string", "null"]},
        "as_of": {"type": "string"},
    },
}
_ERROR_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://monarch.invalid/v1/schema/error",
    "title": "ApiErrorEnvelope", "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"],
                             "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                                            "details": {}}}},
}
_ADMIN_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://monarch.invalid/v1/schema/admin",
    "title": "AdminInfo", "type": "object", "required": ["actor_id", "proc_id", "host", "url"],
    "properties": {k: {"type": "string"} for k in ("actor_id", "proc_id", "host", "url")},
}


# -- the servers ------------------------------------------------------------------------------------


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _make_token(port: int) -> tuple[str, str]:
    """A fresh bearer token, and the 0600 file (in this user's private runtime folder) it is in."""
    from monarch_agents.files import private_dir, runtime_dir

    token = secrets.token_urlsafe(32)
    folder = private_dir(os.path.join(runtime_dir(), "http-tokens"))
    path = os.path.join(folder, f"{os.getpid()}-{port}.token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, path


class _CappedHTTPServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that holds at most :data:`UNREAD_MAX` connections yet to send a
    request (see there); its handlers say when one has (``request_read``)."""

    daemon_threads = True
    request_queue_size = 64  # the listen backlog (socketserver's 5 makes a burst of connects wait seconds)

    def __init__(self, address: Any, handler: Any):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET  # before the socket is made
        self._unread = UnprovenConnections(UNREAD_MAX)
        super().__init__(address, handler)

    @property
    def shed(self) -> int:
        """Connections closed unread to make room for newer ones."""
        return self._unread.shed

    def process_request(self, request: Any, client_address: Any) -> None:
        self._unread.admit(request)
        super().process_request(request, client_address)

    def request_read(self, request: Any) -> None:
        self._unread.proven(request)

    def shutdown_request(self, request: Any) -> None:
        self.request_read(request)
        super().shutdown_request(request)



class JobServer:
    """One HTTP server of a job (telemetry, admin, or both), on a thread of this process."""

    def __init__(self, hosts: _Hosts, *, telemetry: bool, admin: bool, bind: str = "127.0.0.1", port: int = 0):
        self.hosts = hosts
        self.tree = AdminTree(hosts, _now())
        self.telemetry = telemetry
        self.admin = admin
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_S

            def log_message(self, *args: Any) -> None:  # quiet: the program's stderr is the user's
                pass

            def parse_request(self) -> bool:
                ok = super().parse_request()
                self.server.request_read(self.connection)  # type: ignore[attr-defined]
                if not ok:
                    return False
                # Loopback is reachable by every user of the machine, and these answers hold the
                # job's logs, telemetry and stacks: another user's process gets one line.  A peer on
                # another machine (where admin_addr asked for an address beyond loopback) cannot be
                # told by uid: it must show the server's bearer token.
                uid = local_peer_uid(self.connection)
                if uid is not None and uid != os.getuid():
                    return self._refuse(403, "this job's HTTP server answers only its owner's processes")
                if uid is None and not server.authorized(self.headers.get("Authorization")):
                    return self._refuse(401, "this job's HTTP server answers other machines only with its bearer "
                                             "token (Authorization: Bearer TOKEN; its owner has the token file)")
                return True

            def _refuse(self, status: int, line: str) -> bool:
                body = line.encode() + b"\n"
                self.send_response(status)
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Bearer realm="monarch"')
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return False

            def do_GET(self) -> None:
                server._get(self)

            def do_POST(self) -> None:
                server._post(self)

        family_host = bind.strip("[]")
        self._httpd = _CappedHTTPServer((family_host, port), Handler)
        host, bound_port = self._httpd.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        self.url = f"http://{shown}:{bound_port}"
        #: Beyond loopback: the bearer token other machines must show, and the 0600 file that holds it.
        self.token: str | None = None
        self.token_file: str | None = None
        if not _loopback(str(host)):
            self.token, self.token_file = _make_token(bound_port)
            # Removed at close(), or at the program's exit where no one closed it.
            self._forget_token = weakref.finalize(self, _remove_quietly, self.token_file)
            # The example hands curl the header as a file (bash's printf is no process): a token in
            # curl's arguments would be in /proc/PID/cmdline, which `ps` shows every user of the machine.
            print(f"monarch: {self.url} answers other machines only with the bearer token in {self.token_file} "
                  f"(curl -H @<(printf 'Authorization: Bearer %s\\n' \"$(cat {self.token_file})\") {self.url}/v1/tree)",
                  file=sys.stderr, flush=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="monarch-job-http", daemon=True)
        self._thread.start()

    def announce_admin(self) -> None:
        """Say on stdout where this admin server listens, as Monarch's admin agent does when it starts:
        its first line, ``Mesh admin server listening on URL``, is what Monarch's programs tell users to
        read (and what its integration harnesses wait for), then ready-to-run ``curl`` lines."""
        auth = f'-H "Authorization: Bearer $(cat {self.token_file})" ' if self.token_file else ""
        print(f"Mesh admin server listening on {self.url}\n"
              f"  root:  curl {auth}{self.url}/v1/root\n"
              f"  tree:  curl {auth}{self.url}/v1/tree\n"
              f"  API:   curl {auth}{self.url}/SKILL.md", flush=True)

    def authorized(self, header: str | None) -> bool:
        """Whether ``header`` (an ``Authorization`` value) shows this server's bearer token; none is
        shown where the server has none (on loopback every peer's uid is told instead)."""
        scheme, _, value = (header or "").partition(" ")
        return self.token is not None and scheme.lower() == "bearer" and \
            hmac.compare_digest(value.strip().encode(), self.token.encode())

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self.token_file is not None:
            self._forget_token()

    # -- answers ----

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: Any, ctype: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) else \
            json.dumps(body, default=str).encode()
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        self._send(h, status, {"error": {"code": code, "message": message}})

    def _answer(self, h: BaseHTTPRequestHandler, work: Any) -> None:
        """Run ``work()`` -> (status, body, content type) and send it, or the error envelope for
        what it raised: every failure is answered, never a dropped connection."""
        try:
            status, body, ctype = work()
        except NotFound as e:
            self._error(h, 404, "not_found", str(e))
        except BadRequest as e:
            self._error(h, 400, "bad_request", str(e))
        except Unavailable as e:
            self._error(h, 503, "service_unavailable", str(e))
        except TimeoutError as e:
            self._error(h, 504, "gateway_timeout", str(e))
        except Failed as e:
            self._error(h, 500, "internal_error", str(e))
        except Exception as e:  # noqa: BLE001 - see above
            self._error(h, 500, "internal_error", f"{type(e).__name__}: {e}")
        else:
            self._send(h, status, body, ctype)

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlsplit(h.path).path
        if self.admin and path == "/SKILL.md":
            from monarch._workbench.admin_api import skill_md

            self._send(h, 200, skill_md(self._base_url(h)), "text/markdown; charset=utf-8")
            return
        if not self.admin or not path.startswith("/v1/"):
            self._error(h, 404, "not_found", f"no such path {path}")
            return
        rest = path[len("/v1/"):]
        json_ = "application/json"
        if rest == "openapi.json":
            from monarch._workbench.admin_api import openapi

            self._answer(h, lambda: (200, openapi(), json_))
            return
        if rest.startswith("config/"):
            ref = urllib.parse.unquote(rest[len("config/"):])
            self._answer(h, lambda: (200, self.tree.config(ref), json_))
            return
        try:
            if rest == "admin":
                self._send(h, 200, {"actor_id": f"mesh_admin@client/{os.getpid()}", "proc_id": f"client/{os.getpid()}",
                                    "host": urllib.parse.urlsplit(self.url).hostname or "", "url": self.url})
            elif rest == "schema":
                self._send(h, 200, _NODE_SCHEMA)
            elif rest == "schema/error":
                self._send(h, 200, _ERROR_SCHEMA)
            elif rest == "schema/admin":
                self._send(h, 200, _ADMIN_SCHEMA)
            elif rest == "tree":
                self._send(h, 200, self.tree.tree(), "text/plain; charset=utf-8")
            elif rest.startswith("pyspy/"):
                self._send(h, 200, self.tree.pyspy(urllib.parse.unquote(rest[len("pyspy/"):])))
            elif rest == "query":
                self._error(h, 405, "bad_request", 'POST /v1/query with {"sql": "SELECT ..."}')
            else:
                self._send(h, 200, self.tree.resolve(urllib.parse.unquote(rest)))
        except NotFound as e:
            self._error(h, 404, "not_found", str(e))
        except BadRequest as e:
            self._error(h, 400, "bad_request", str(e))
        except TimeoutError as e:
            self._error(h, 504, "gateway_timeout", str(e))
        except Exception as e:  # noqa: BLE001 - every failure is answered, never a dropped connection
            self._error(h, 500, "internal_error", f"{type(e).__name__}: {e}")

    def _base_url(self, h: BaseHTTPRequestHandler) -> str:
        return f"http://{h.headers.get('Host')}" if h.headers.get("Host") else self.url

    def _body(self, h: BaseHTTPRequestHandler) -> Any:
        length = int(h.headers.get("Content-Length") or 0)
        try:
            return json.loads(h.rfile.read(min(length, 1 << 20)) or b"{}")
        except ValueError as e:
            raise BadRequest(f"body is not JSON: {e}") from None

    def _post(self, h: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlsplit(h.path).path
        dump, svg = "/v1/pyspy_dump/", "/v1/pyspy_profile_svg/"
        if self.admin and path.startswith(dump):
            ref = urllib.parse.unquote(path[len(dump):])
            self._answer(h, lambda: (200, self.tree.pyspy_dump(ref), "application/json"))
            return
        if self.admin and path.startswith(svg):
            ref = urllib.parse.unquote(path[len(svg):])
            self._answer(h, lambda: (200, self.tree.profile_svg(ref, self._body(h)), "image/svg+xml"))
            return
        if path == "/api/pyspy_dump" and self.telemetry:
            self._answer(h, lambda: (200, store_pyspy_dump(self.hosts, self._body(h)), "application/json"))
            return
        if not ((path == "/api/query" and self.telemetry) or (path == "/v1/query" and self.admin)):
            self._error(h, 404, "not_found", f"no such path {path}")
            return
        try:
            length = int(h.headers.get("Content-Length") or 0)
            body = json.loads(h.rfile.read(min(length, 1 << 20)) or b"{}")
            sql = body.get("sql") if isinstance(body, dict) else None
            if not isinstance(sql, str) or not sql.strip():
                self._error(h, 400, "bad_request", 'expected {"sql": "SELECT ..."}')
                return
        except ValueError as e:
            self._error(h, 400, "bad_request", f"body is not JSON: {e}")
            return
        try:
            table = run_query(self.hosts, sql)
        except Exception as e:  # noqa: BLE001 - a bad query is the client's answer
            self._error(h, 400, "bad_request", str(e).splitlines()[0] if str(e) else type(e).__name__)
            return
        self._send(h, 200, {"rows": table.to_pylist()})


def store_pyspy_dump(hosts: _Hosts, body: Any) -> dict:
    """``POST /api/pyspy_dump``: keep a py-spy result a program took elsewhere under its ``dump_id``,
    as Monarch's telemetry service does: its frames become ``stacks`` rows (``pyspy_dumps``,
    ``pyspy_frames``...) and its locals ``pyspy_local_variables``, held by the job's first host agent
    (the host whose agent answers the job's queries first)."""
    from monarch_agents.messages import TelemetryRows
    from monarch_telemetry.recorder import now_us
    from monarch_telemetry.stacks import stored_dump_rows

    if not isinstance(body, dict) or not all(isinstance(body.get(k), str) for k in
                                             ("dump_id", "proc_ref", "pyspy_result_json")):
        raise BadRequest('expected {"dump_id": "...", "proc_ref": "...", "pyspy_result_json": "..."}')
    if not hosts.hosts:
        raise NotFound("this job has no host to keep the dump")
    try:
        rows = stored_dump_rows(body["dump_id"], body["proc_ref"], body["pyspy_result_json"], "client", now_us())
    except ValueError as e:
        raise BadRequest(str(e)) from None
    first = min(hosts.hosts, key=lambda h: h.host_rank)
    hosts.runtime().send(first.addr, TelemetryRows(rows))
    # The agent keeps pushed rows on a worker thread of its own: answered once a query sees them, so a
    # query sent after this answer finds the dump.
    want = rows["stacks"][0] if "stacks" in rows else 0
    deadline = time.monotonic() + DEFAULT_QUERY_TIMEOUT_S
    while want:
        seen = run_query(hosts, f"SELECT count(*) AS n FROM stacks WHERE dump_id = '{_q(body['dump_id'])}'")
        if seen.column("n")[0].as_py() >= want:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the dump was sent to host {first.host!r} and is not in its tables yet")
        time.sleep(0.05)
    return {"status": "ok"}


def capture_snapshot(hosts: _Hosts, started_at_us: int) -> dict[str, tuple[int, list]]:
    """One capture of the job's mesh admin tree (root, hosts, procs, actors) as rows of Monarch's
    snapshot tables ({table: (rows, columns)}, as hosts take them), read with four queries."""
    from monarch_telemetry.recorder import now_us
    from monarch_telemetry.schema import TABLES

    sid, ts = str(uuid.uuid4()), now_us()
    out: dict[str, list[dict]] = {n: [] for n in ("snapshots", "nodes", "children", "root_nodes", "host_nodes",
                                                  "proc_nodes", "actor_nodes", "actor_failures")}

    def node(ref: str, kind: str) -> None:
        out["nodes"].append({"snapshot_id": sid, "node_id": ref, "node_kind": kind, "as_of": ts})

    def child(parent: str, ref: str, key: int, stopped: bool = False) -> None:
        out["children"].append({"snapshot_id": sid, "parent_id": parent, "child_id": ref, "child_sort_key": key,
                                "is_system": False, "is_stopped": stopped})

    names = [h.host for h in hosts.hosts]
    info = {r["host"]: r for r in run_query(hosts, "SELECT host, addr FROM hosts").to_pylist()}
    procs = run_query(hosts, "SELECT host, pid, mesh, status FROM procs WHERE kind = 'proc' AND ended IS NULL "
                             "ORDER BY started").to_pylist()
    actors = run_query(hosts,
        "SELECT a.id, a.host, a.pid, a.ref_name AS full_name, a.display_name, a.timestamp_us, m.class AS class, "
        "s.new_status AS status, s.reason AS reason, s.timestamp_us AS status_us, "
        "coalesce(c.n, 0) AS n, coalesce(c.t, 0) AS t, c.last AS last "
        "FROM actors_ext a LEFT JOIN meshes m ON a.mesh_id = m.id "
        "LEFT JOIN (SELECT actor_id, new_status, reason, timestamp_us, row_number() OVER "
        "(PARTITION BY actor_id ORDER BY timestamp_us DESC) AS k FROM actor_status_events) s "
        "ON s.actor_id = a.id AND s.k = 1 "
        "LEFT JOIN (SELECT to_actor_id, count(*) AS n, sum(latency_us) AS t, "
        "last_value(endpoint ORDER BY timestamp_us) AS last FROM messages_ext GROUP BY to_actor_id) c "
        "ON c.to_actor_id = a.id WHERE (a.display_name IS DISTINCT FROM '<root>') AND a.ref_name IS NOT NULL "
        "ORDER BY a.timestamp_us").to_pylist()
    out["snapshots"].append({"snapshot_id": sid, "snapshot_ts": ts})
    node("root", "root")
    out["root_nodes"].append({"snapshot_id": sid, "node_id": "root", "num_hosts": len(names),
                              "started_at": started_at_us, "started_by": f"{getpass.getuser()}@{socket.gethostname()}"})
    by_proc: dict[tuple, list[dict]] = {}
    for a in actors:
        by_proc.setdefault((a["host"], a["pid"]), []).append(a)
    for hi, name in enumerate(names):
        href = f"host:{name}"
        node(href, "host")
        child("root", href, hi)
        mine = [p for p in procs if p["host"] == name]
        addr = info.get(name, {}).get("addr") or next(h.addr for h in hosts.hosts if h.host == name)
        out["host_nodes"].append({"snapshot_id": sid, "node_id": href, "addr": addr, "host_num_procs": len(mine)})
        for pi, p in enumerate(mine):
            pref = f"proc:{name}/{p['pid']}"
            node(pref, "proc")
            child(href, pref, pi)
            on = by_proc.get((name, p["pid"]), [])
            failed = 0
            for ai, a in enumerate(on):
                aref = f"actor:{name}/{p['pid']},{a['full_name']}"
                status = (a["status"] or "created").lower()
                stopped = status in ("stopped", "failed")
                failed += status == "failed"
                node(aref, "actor")
                child(pref, aref, ai, stopped)
                cls = a["class"] or ""
                out["actor_nodes"].append({
                    "snapshot_id": sid, "node_id": aref,
                    "actor_status": f"{status}: {a['reason']}" if a["reason"] and stopped else status,
                    "actor_type": cls[len("Python<"):-1] if cls.startswith("Python<") else cls,
                    "instance_id": str(a["id"]), "messages_processed": int(a["n"]), "created_at": a["timestamp_us"],
                    "last_message_handler": a["last"], "total_processing_time_us": int(a["t"] or 0),
                    "queue_depth": 0, "is_system": False})
                if status == "failed":
                    out["actor_failures"].append({
                        "snapshot_id": sid, "node_id": aref, "failure_error_message": a["reason"] or "",
                        "failure_root_cause_actor": aref, "failure_root_cause_name": a["display_name"],
                        "failure_occurred_at": a["status_us"] or ts, "failure_is_propagated": False})
            out["proc_nodes"].append({
                "snapshot_id": sid, "node_id": pref, "proc_name": f"{p['mesh']}/{p['pid']}",
                "num_actors": sum(1 for a in on if (a["status"] or "").lower() not in ("stopped", "failed")),
                "stopped_retention_cap": 0, "is_poisoned": failed > 0 or p["status"] in ("failed", "killed"),
                "failed_actor_count": failed})
    return {n: (len(rows), [[r.get(c) for r in rows] for c in TABLES[n].column_names]) for n, rows in out.items() if rows}


class SnapshotTimer:
    """Monarch's periodic topology snapshots: every ``interval_s`` a capture of the job's tree
    (:func:`capture_snapshot`) goes to the job's first host agent, until :meth:`close`."""

    def __init__(self, hosts: _Hosts, interval_s: float):
        self.hosts, self.interval_s = hosts, interval_s
        self._started_us = int(time.time() * 1e6)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monarch-snapshots", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from monarch_agents.messages import TelemetryRows

        while not self._stop.wait(self.interval_s):
            try:
                rows = capture_snapshot(self.hosts, self._started_us)
                first = min(self.hosts.hosts, key=lambda h: h.host_rank)
                self.hosts.runtime().send(first.addr, TelemetryRows(rows))
            except Exception as e:  # a query that failed (a host gone, the job closing): the next one may not
                log.debug("snapshot not taken: %s", e)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=DEFAULT_QUERY_TIMEOUT_S * 2)


def parse_bind(addr: str | None) -> tuple[str, int]:
    """``MeshAdminConfig.admin_addr`` ("HOST:PORT", "[::1]:PORT", "tcp://HOST:PORT") -> (host, port);
    None means loopback on a free port."""
    if not addr:
        return "127.0.0.1", 0
    text = addr.split("://", 1)[-1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"admin_addr {addr!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)
