"""A job's telemetry and admin services, as Monarch's ``enable_telemetry`` / ``enable_admin`` give them.

Both are HTTP servers this client runs on loopback (unless ``MeshAdminConfig(admin_addr=...)``
says otherwise) for as long as it holds the job:

* telemetry (``JobState.telemetry_url``): ``POST /api/query`` ``{"sql": ...}`` answers
  ``{"rows": [...]}`` from the job's telemetry tables (the SQL of ``monarch query``, run on every
  host); ``JobState.query_engine.query(sql)`` is the same in process (a ``pyarrow`` reader).
* admin (``JobState.admin_url``): Monarch's mesh admin API, a tree of references to walk from
  ``GET /v1/root`` (hosts, then procs, then actors, each ``GET /v1/{reference}``), ``GET
  /v1/pyspy/{proc}`` (the proc's Python stacks by ``monarch stack``'s py-spy), ``GET /v1/tree``,
  ``GET /v1/admin``, ``POST /v1/query`` and JSON Schemas under ``/v1/schema``.  Errors are
  ``{"error": {"code": "not_found" | "bad_request" | "gateway_timeout" | "internal_error",
  "message": ...}}``.  The tree is read from the telemetry tables (``hosts``, ``procs``,
  ``actors``, ``actor_status_events``, ``messages``), so it shows what they recorded.

References are opaque strings (``root``, ``host:NAME``, ``proc:NAME/PID``,
``actor:NAME/PID/ACTOR``): round-trip them, percent-encoded in the URL path.
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_QUERY_TIMEOUT_S = 10.0


@dataclass
class _Hosts:
    """What the telemetry fan-out needs of a job: its hosts (addr, host, host_rank) and runtime."""

    hosts: list
    rt: Any

    def runtime(self) -> Any:
        return self.rt


def hosts_of(meshes: dict[str, Any]) -> _Hosts:
    """Every host of a job's host meshes, once each."""
    seen: dict[str, Any] = {}
    rt = None
    for mesh in meshes.values():
        rt = rt or mesh._rt()
        for h in mesh._hosts:
            seen.setdefault(h.addr, h)
    return _Hosts(sorted(seen.values(), key=lambda h: h.host_rank), rt)


def run_query(hosts: _Hosts, sql: str, timeout_s: float = DEFAULT_QUERY_TIMEOUT_S) -> Any:
    from monarch._workbench.telemetry import query

    return query(hosts, sql, timeout_s=timeout_s).table  # type: ignore[arg-type]


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


class AdminTree:
    """Resolves admin references from the telemetry tables of a job."""

    def __init__(self, hosts: _Hosts, started_at: str):
        self.hosts = hosts
        self.started_at = started_at

    def _rows(self, sql: str) -> list[dict]:
        return run_query(self.hosts, sql).to_pylist()

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
        if kind == "actor" and rest.count("/") >= 2:
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
        procs = self._rows(f"SELECT pid FROM procs WHERE kind = 'proc' AND host = '{_q(name)}' ORDER BY started")
        addr = info[0]["addr"] if info else next(h.addr for h in self.hosts.hosts if h.host == name)
        rss = info[0]["agent_rss_bytes"] if info else None
        props = {"Host": {"addr": addr, "num_procs": len(procs), "system_children": [],
                          "memory": {"process_rss_bytes": rss, "process_vm_size_bytes": None}}}
        return self._payload(f"host:{name}", props, [f"proc:{name}/{p['pid']}" for p in procs], "root")

    def _actor_rows(self, host: str, pid: int) -> list[dict]:
        return self._rows(
            "SELECT a.id, a.full_name, a.display_name, a.timestamp_us, m.class AS class, "
            "s.new_status AS status, s.reason AS reason, s.timestamp_us AS status_us "
            "FROM actors a LEFT JOIN meshes m ON a.mesh_id = m.id "
            "LEFT JOIN (SELECT actor_id, new_status, reason, timestamp_us, row_number() OVER "
            "(PARTITION BY actor_id ORDER BY timestamp_us DESC) AS n FROM actor_status_events) s "
            f"ON s.actor_id = a.id AND s.n = 1 WHERE a.host = '{_q(host)}' AND a.pid = {int(pid)} "
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
            ref = f"actor:{host}/{pid}/{a['full_name']}"
            status = (a["status"] or "").lower()
            (stopped if status in ("stopped", "failed") else live).append(ref)
            failed += status == "failed"
        props = {"Proc": {"proc_name": f"{p['mesh']}/{pid}", "num_actors": len(live), "system_children": [],
                          "stopped_children": stopped, "stopped_retention_cap": 0,
                          "is_poisoned": p["status"] in ("failed", "killed"), "failed_actor_count": failed,
                          "debug": {"memory": {"process_rss_bytes": p["rss_bytes"], "process_vm_size_bytes": None},
                                    "actor_work_queue_depth_total": 0, "actor_work_queue_depth_max": 0,
                                    "actor_work_queue_depth_high_water_mark": 0}}}
        return self._payload(f"proc:{host}/{pid}", props, live + stopped, f"host:{host}")

    def _actor(self, host: str, pid: int, name: str) -> dict:
        rows = [a for a in self._actor_rows(host, pid) if a["full_name"] == name]
        if not rows:
            raise NotFound(f"no actor {name!r} in proc {pid} on host {host!r}")
        a = rows[0]
        msgs = self._rows(f"SELECT count(*) AS n, sum(latency_us) AS t FROM messages WHERE to_actor_id = {int(a['id'])}")
        last = self._rows(f"SELECT endpoint FROM messages WHERE to_actor_id = {int(a['id'])} "
                          "ORDER BY timestamp_us DESC LIMIT 1")
        status = (a["status"] or "created").lower()
        shown = f"{status}: {a['reason']}" if a["reason"] and status in ("failed", "stopped") else status
        failure = None
        if status == "failed":
            failure = {"error_message": a["reason"] or "", "root_cause_actor": f"actor:{host}/{pid}/{name}",
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
        return self._payload(f"actor:{host}/{pid}/{name}", props, [], f"proc:{host}/{pid}")

    def tree(self) -> str:
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

    def pyspy(self, ref: str) -> dict:
        from monarch._workbench.telemetry import stacks

        kind, _, rest = ref.partition(":")
        host, _, pid_s = rest.rpartition("/")
        if kind != "proc" or not pid_s.isdigit():
            raise NotFound(f"{ref!r} is not a proc reference (proc:HOST/PID)")
        pid = int(pid_s)
        targets = [h for h in self.hosts.hosts if h.host == host]
        if not targets:
            raise NotFound(f"no host {host!r}")
        table = stacks(self.hosts, hosts=targets).table  # type: ignore[arg-type]
        rows = [r for r in table.to_pylist() if r["pid"] == pid]
        if not rows:
            raise NotFound(f"no live proc {pid} on host {host!r}")
        errors = [r["error"] for r in rows if r.get("error")]
        if errors:
            if "not found" in errors[0].lower() or "no py-spy" in errors[0].lower():
                return {"BinaryNotFound": {"searched": ["py-spy"]}}
            return {"Failed": {"pid": pid, "binary": "py-spy", "exit_code": None, "stderr": errors[0]}}
        threads: dict[int, dict] = {}
        for r in sorted(rows, key=lambda r: (r["thread_id"], r["depth"])):
            t = threads.setdefault(r["thread_id"], {"pid": pid, "thread_id": r["thread_id"],
                                                    "thread_name": r["thread_name"], "os_thread_id": None,
                                                    "active": True, "owns_gil": False, "frames": []})
            t["frames"].append({"name": r["function"], "filename": r["filename"], "line": r["line"],
                                "is_entry": False, "module": None,
                                "short_filename": os.path.basename(r["filename"] or ""), "locals": None})
        return {"Ok": {"pid": pid, "binary": "py-spy", "stack_traces": list(threads.values()), "warnings": []}}


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


class JobServer:
    """One HTTP server of a job (telemetry, admin, or both), on a thread of this process."""

    def __init__(self, hosts: _Hosts, *, telemetry: bool, admin: bool, bind: str = "127.0.0.1", port: int = 0):
        self.hosts = hosts
        self.tree = AdminTree(hosts, _now())
        self.telemetry = telemetry
        self.admin = admin
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet: the program's stderr is the user's
                pass

            def do_GET(self) -> None:
                server._get(self)

            def do_POST(self) -> None:
                server._post(self)

        family_host = bind.strip("[]")
        ThreadingHTTPServer.address_family = socket.AF_INET6 if ":" in family_host else socket.AF_INET
        self._httpd = ThreadingHTTPServer((family_host, port), Handler)
        self._httpd.daemon_threads = True
        host, bound_port = self._httpd.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        self.url = f"http://{shown}:{bound_port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="monarch-job-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- answers ----

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: Any, ctype: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body, default=str).encode()
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        self._send(h, status, {"error": {"code": code, "message": message}})

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlsplit(h.path).path
        if not self.admin or not path.startswith("/v1/"):
            self._error(h, 404, "not_found", f"no such path {path}")
            return
        rest = path[len("/v1/"):]
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
            else:
                self._send(h, 200, self.tree.resolve(urllib.parse.unquote(rest)))
        except NotFound as e:
            self._error(h, 404, "not_found", str(e))
        except TimeoutError as e:
            self._error(h, 504, "gateway_timeout", str(e))
        except Exception as e:  # noqa: BLE001 - every failure is answered, never a dropped connection
            self._error(h, 500, "internal_error", f"{type(e).__name__}: {e}")

    def _post(self, h: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlsplit(h.path).path
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
