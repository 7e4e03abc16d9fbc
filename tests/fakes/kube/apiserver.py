"""A FAKE Kubernetes API server for tests: the real REST paths, objects and status codes.

No real kube-apiserver can be installed on this project's machines (not in PyPI, Debian or
npm without downloads), so the Kubernetes scheduler is tested against this stand-in. It speaks
what the official ``kubernetes`` Python client and the real ``kubectl`` use: discovery
(``/api``, ``/apis``, ``/api/v1``, ``/apis/apps/v1``, the ``monarch.pytorch.org`` group when its
CRD is "installed"), namespaced CRUD on pods, services, secrets, events, statefulsets and
monarchmeshes, ``pods/{name}/log``, ``pods/{name}/portforward`` (``portforward.py``), label and field selectors, ``watch=true`` streams,
``resourceVersion``, 201 on create, 404/409/422 ``Status`` bodies, ``dryRun=All`` and
``kubectl get``'s ``Table`` responses. A bearer token is required, as on a real cluster.

What a real cluster does behind the API lives beside it: ``controllers.py`` (StatefulSet,
the monarch operator, garbage collection, a pod scheduler) and ``kubelet.py`` (runs each pod's
container command as a process on this machine).
"""

from __future__ import annotations

import copy
import json
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from tests.fakes.kube import portforward

MONARCH_GROUP = "monarch.pytorch.org"
MONARCH_VERSION = "v1alpha1"


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = [
    Resource("", "v1", "pods", "Pod", short=("po",)),
    Resource("", "v1", "services", "Service", short=("svc",)),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "events", "Event", short=("ev",)),
    Resource("", "v1", "namespaces", "Namespace", namespaced=False, short=("ns",)),
    Resource("", "v1", "nodes", "Node", namespaced=False, short=("no",)),
    Resource("apps", "v1", "statefulsets", "StatefulSet", short=("sts",)),
    Resource(MONARCH_GROUP, MONARCH_VERSION, "monarchmeshes", "MonarchMesh", short=("mm",)),
]
_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


def match_labels(selector: str, labels: dict) -> bool:
    """Equality-based label selectors (``a=b,c!=d,e``), as kubectl and the client send them."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.strip().rstrip("=")) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field(obj: dict, path: str):
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def match_fields(selector: str, obj: dict) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        neg = "!=" in term
        k, v = term.split("!=" if neg else "=", 1)
        got = _field(obj, k.strip().rstrip("="))
        got = "" if got is None else str(got)
        if (got == v.strip()) == neg:
            return False
    return True


class Store:
    """Every object by (resource, namespace, name), one resourceVersion counter, watchers."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[Resource, str, str], dict] = {}
        self.rv = 0
        self.watchers: list[tuple[Resource, str, queue.Queue]] = []
        self.changed = threading.Condition(self.lock)

    def _bump(self, obj: dict) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _notify(self, res: Resource, kind: str, obj: dict) -> None:
        for wres, ns, q in list(self.watchers):
            if wres == res and (not ns or ns == obj["metadata"].get("namespace", "")):
                q.put({"type": kind, "object": copy.deepcopy(obj)})
        self.changed.notify_all()

    def create(self, res: Resource, ns: str, obj: dict, dry_run: bool = False) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        with self.lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            name = meta.get("name", "")
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name or ""):
                raise ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: metadata.name: Invalid value: '
                                               f'"{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                                               "alphanumeric characters, '-' or '.'")
            key = (res, ns if res.namespaced else "", name)
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{res.plural}.{res.group or "core"} "{name}" already exists'
                               .replace(".core", ""))
            if res.namespaced:
                meta["namespace"] = ns
            meta.setdefault("labels", {})
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            meta["generation"] = 1
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            if res.kind == "Pod":
                obj.setdefault("status", {"phase": "Pending", "conditions": []})
            if res.kind == "Secret" and "stringData" in obj:  # the API server folds stringData into data
                import base64

                data = obj.setdefault("data", {})
                for k, v in obj.pop("stringData").items():
                    data[k] = base64.b64encode(v.encode()).decode()
            if dry_run:
                return obj
            self._bump(obj)
            self.objects[key] = obj
            self._notify(res, "ADDED", obj)
            return copy.deepcopy(obj)

    def get(self, res: Resource, ns: str, name: str) -> dict:
        with self.lock:
            obj = self.objects.get((res, ns if res.namespaced else "", name))
            if obj is None:
                grp = f"{res.plural}.{res.group}" if res.group else res.plural
                raise ApiError(404, "NotFound", f'{grp} "{name}" not found')
            return copy.deepcopy(obj)

    def list(self, res: Resource, ns: str, labels: str = "", fields: str = "") -> list[dict]:
        with self.lock:
            return [copy.deepcopy(o) for (r, ons, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][1:])
                    if r == res and (not ns or ons == ns) and match_labels(labels, o["metadata"].get("labels") or {})
                    and match_fields(fields, o)]

    def update(self, res: Resource, ns: str, name: str, mutate) -> dict:
        """Apply ``mutate(obj)`` under the lock (controllers and kubelet use this for status)."""
        with self.lock:
            key = (res, ns if res.namespaced else "", name)
            obj = self.objects.get(key)
            if obj is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            before = json.dumps(obj, sort_keys=True)
            mutate(obj)
            if json.dumps(obj, sort_keys=True) != before:
                self._bump(obj)
                self._notify(res, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, res: Resource, ns: str, name: str, dry_run: bool = False) -> dict:
        """Pods get a deletionTimestamp and are removed by their kubelet; the rest go at once."""
        with self.lock:
            key = (res, ns if res.namespaced else "", name)
            obj = self.get(res, ns, name)
            if dry_run:
                return obj
            if res.kind == "Pod" and obj.get("spec", {}).get("nodeName") and obj["status"].get("phase") in ("Pending", "Running"):
                return self.update(res, ns, name, lambda o: o["metadata"].setdefault("deletionTimestamp", now_iso()))
            self.remove(key)
            return obj

    def remove(self, key: tuple[Resource, str, str]) -> None:
        with self.lock:
            obj = self.objects.pop(key, None)
            if obj is not None:
                self._bump(obj)
                self._notify(key[0], "DELETED", obj)

    def all_uids(self) -> set[str]:
        with self.lock:
            return {o["metadata"]["uid"] for o in self.objects.values()}

    def watch(self, res: Resource, ns: str) -> queue.Queue:
        q: queue.Queue = queue.Queue()
        with self.lock:
            self.watchers.append((res, ns, q))
        return q

    def unwatch(self, q: queue.Queue) -> None:
        with self.lock:
            self.watchers = [w for w in self.watchers if w[2] is not q]

    def event(self, involved: dict, reason: str, message: str, type_: str = "Normal") -> None:
        """Record an Event as the component that saw it would (kubectl describe lists these)."""
        meta = involved["metadata"]
        ev = {"metadata": {"generateName": meta["name"] + "."},
              "involvedObject": {"kind": involved.get("kind"), "name": meta["name"], "namespace": meta.get("namespace"),
                                 "uid": meta.get("uid"), "apiVersion": involved.get("apiVersion")},
              "reason": reason, "message": message, "type": type_, "count": 1,
              "firstTimestamp": now_iso(), "lastTimestamp": now_iso(), "source": {"component": "fake-kube"}}
        res = _BY_PATH[("", "v1", "events")]
        with self.lock:
            for old in self.list(res, meta.get("namespace", "")):
                io = old["involvedObject"]
                if io.get("uid") == meta.get("uid") and old["reason"] == reason and old["message"] == message:
                    return  # one Event per distinct reason and message, as the dedup on a real cluster
            self.create(res, meta.get("namespace", ""), ev)


def merge_patch(target: dict, patch: dict) -> dict:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge_patch(target[k], v)
        else:
            target[k] = copy.deepcopy(v)
    return target


class FakeApiServer:
    """The fake API server on ``host`` (127.0.0.1); ``crd_installed`` adds the monarch.pytorch.org group."""

    def __init__(self, token: str, crd_installed: bool = False, tls: tuple[str, str] | None = None,
                 host: str = "127.0.0.1"):
        self.token = token
        self.crd_installed = crd_installed
        self.store = Store()
        self.store.create(_BY_PATH[("", "v1", "namespaces")], "", {"metadata": {"name": "default"}})
        self.httpd = ThreadingHTTPServer((host, 0), _handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        if tls is not None:  # kubectl sends a bearer token only over TLS
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.url = f"https://{host}:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="fake-apiserver", daemon=True)
        self.closed = threading.Event()
        #: Set by the kubelet: (namespace, pod name) -> the path of its container's log file.
        self.log_files: dict[tuple[str, str], str] = {}

    def start(self) -> "FakeApiServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.closed.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def resources(self) -> list[Resource]:
        return [r for r in RESOURCES if self.crd_installed or r.group != MONARCH_GROUP]

    def resolve(self, group: str, version: str, plural: str) -> Resource:
        res = _BY_PATH.get((group, version, plural))
        if res is None or res not in self.resources():
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return res

    # -- discovery ---------------------------------------------------------------------------

    def discovery(self, path: str) -> dict | None:
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0-monarch-fake", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}]}
        groups = sorted({(r.group, r.version) for r in self.resources() if r.group})
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                 "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups]}
        for g, v in [("", "v1"), *groups]:
            if path == (f"/apis/{g}/{v}" if g else f"/api/{v}"):
                rs = [r for r in self.resources() if (r.group, r.version) == (g, v)]
                out = []
                for r in rs:
                    out.append({"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                                "kind": r.kind, "shortNames": list(r.short),
                                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]})
                    if r.kind == "Pod":
                        out.append({"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]})
                return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{g}/{v}" if g else v, "resources": out}
        return None


def _table(res: Resource, items: list[dict]) -> dict:
    """The ``meta.k8s.io/v1 Table`` that ``kubectl get`` asks for."""
    cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name"}]
    extra: list[tuple[str, callable]] = []
    if res.kind == "Pod":
        extra = [("Ready", lambda o: f"{sum(1 for c in o['status'].get('containerStatuses', []) if c.get('ready'))}/"
                                     f"{len(o['spec'].get('containers', []))}"),
                 ("Status", lambda o: ("Terminating" if o["metadata"].get("deletionTimestamp") else _pod_reason(o))),
                 ("Restarts", lambda o: sum(c.get("restartCount", 0) for c in o["status"].get("containerStatuses", []))),
                 ("IP", lambda o: o["status"].get("podIP", "<none>"))]
    elif res.kind == "StatefulSet":
        extra = [("Ready", lambda o: f"{o.get('status', {}).get('readyReplicas', 0)}/{o['spec'].get('replicas', 0)}")]
    elif res.kind == "MonarchMesh":
        extra = [("Ready", lambda o: f"{o.get('status', {}).get('readyReplicas', 0)}/{o['spec'].get('replicas', 0)}")]
    cols += [{"name": n, "type": "string", "format": "", "description": n} for n, _ in extra]
    cols.append({"name": "Age", "type": "string", "format": "", "description": "Age"})
    rows = []
    for o in items:
        cells = [o["metadata"]["name"], *[str(f(o)) for _, f in extra], _age(o)]
        rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                                "metadata": o["metadata"]}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "columnDefinitions": cols, "rows": rows}


def _age(obj: dict) -> str:
    import calendar

    t = calendar.timegm(time.strptime(obj["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
    s = max(0, int(time.time() - t))
    return f"{s}s" if s < 120 else f"{s // 60}m"


def _pod_reason(pod: dict) -> str:
    for c in pod["status"].get("containerStatuses", []):
        waiting = c.get("state", {}).get("waiting")
        if waiting:
            return waiting.get("reason", "Waiting")
    return pod["status"].get("phase", "Pending")


_PATH_RE = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


def _handler(server: FakeApiServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: tests read their own output
            pass

        def _send(self, code: int, body: dict | str, ctype: str = "application/json") -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except ValueError:
                raise ApiError(400, "BadRequest", "the request body is not valid JSON") from None

        def _route(self, method: str) -> None:
            url = urlsplit(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if self.headers.get("Authorization") != f"Bearer {server.token}":
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                if method == "GET":
                    d = server.discovery(url.path.rstrip("/"))
                    if d is not None:
                        return self._send(200, d)
                m = _PATH_RE.match(url.path)
                if not m:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                group, version = (m["g"], m["v"]) if m["g"] else ("", m["cv"])
                plural, name, sub = m["res"], m["name"], m["sub"]
                res = server.resolve(group, version, plural)
                ns = m["ns"] or ""
                if res.namespaced and name is None and method == "POST" and not ns:
                    raise ApiError(400, "BadRequest", "a namespace is required")
                dry = q.get("dryRun") == "All"
                store = server.store
                if method == "GET" and name is None:
                    items = store.list(res, ns, q.get("labelSelector", ""), q.get("fieldSelector", ""))
                    if q.get("watch") in ("1", "true"):
                        return self._watch(res, ns, q, items)
                    if "as=Table" in (self.headers.get("Accept") or ""):
                        return self._send(200, _table(res, items))
                    return self._send(200, {"kind": res.kind + "List", "apiVersion": res.api_version,
                                            "metadata": {"resourceVersion": str(store.rv)}, "items": items})
                if method == "GET" and sub == "log":
                    return self._send(200, server_logs(server, ns, name, q), "text/plain")
                if method == "GET" and sub == "portforward":
                    return self._portforward(ns, name, q)
                if method == "GET":
                    obj = store.get(res, ns, name)
                    if "as=Table" in (self.headers.get("Accept") or ""):
                        return self._send(200, _table(res, [obj]))
                    return self._send(200, obj)
                if method == "POST" and name is None:
                    body = self._body()
                    if body.get("kind") not in (None, res.kind):
                        raise ApiError(400, "BadRequest", f"the body's kind {body.get('kind')} is not {res.kind}")
                    return self._send(201, store.create(res, ns, body, dry_run=dry))
                if method == "PUT" and name:
                    body = self._body()

                    def replace(o: dict) -> None:
                        keep = {k: o["metadata"][k] for k in ("uid", "creationTimestamp", "namespace") if k in o["metadata"]}
                        o.clear()
                        o.update(copy.deepcopy(body))
                        o["metadata"].update(keep)
                    return self._send(200, store.update(res, ns, name, replace))
                if method == "PATCH" and name:
                    body = self._body()
                    return self._send(200, store.update(res, ns, name, lambda o: merge_patch(o, body)))
                if method == "DELETE" and name:
                    self._body()
                    return self._send(200, store.delete(res, ns, name, dry_run=dry))
                if method == "DELETE":
                    self._body()
                    gone = [store.delete(res, ns, o["metadata"]["name"], dry_run=dry)
                            for o in store.list(res, ns, q.get("labelSelector", ""), q.get("fieldSelector", ""))]
                    return self._send(200, {"kind": res.kind + "List", "apiVersion": res.api_version,
                                            "metadata": {}, "items": gone})
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {url.path}")
            except ApiError as e:
                self._send(e.code, e.status())

        def _portforward(self, ns: str, name: str, q: dict) -> None:
            pod = server.store.get(_BY_PATH[("", "v1", "pods")], ns, name)
            if (self.headers.get("Upgrade") or "").lower() != "websocket":
                raise ApiError(400, "BadRequest", "Upgrade request required")
            ip = (pod.get("status") or {}).get("podIP")
            if not ip or (pod.get("status") or {}).get("phase") != "Running":
                raise ApiError(400, "BadRequest", f"pod {name} is not running")
            try:
                port = int(q.get("ports", ""))
            except ValueError:
                raise ApiError(400, "BadRequest", "exactly one port is supported in ports=") from None
            portforward.serve(self, ip, port, name)

        def _watch(self, res: Resource, ns: str, q: dict, items: list[dict]) -> None:
            """A chunked stream of watch events, one JSON object a line, until the timeout or close."""
            labels, fields = q.get("labelSelector", ""), q.get("fieldSelector", "")
            timeout = min(float(q.get("timeoutSeconds") or 300), 300)
            queue_ = server.store.watch(res, ns)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(ev: dict) -> None:
                data = (json.dumps(ev) + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            try:
                since = int(q.get("resourceVersion") or 0)
                if not q.get("resourceVersion"):  # no version: the current objects first, as ADDED
                    for o in items:
                        chunk({"type": "ADDED", "object": o})
                end = time.monotonic() + timeout
                while time.monotonic() < end and not server.closed.is_set():
                    try:
                        ev = queue_.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    o = ev["object"]
                    if int(o["metadata"]["resourceVersion"]) <= since:
                        continue
                    if match_labels(labels, o["metadata"].get("labels") or {}) and match_fields(fields, o):
                        chunk(ev)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                server.store.unwatch(queue_)
                self.close_connection = True

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_PUT(self) -> None:
            self._route("PUT")

        def do_PATCH(self) -> None:
            self._route("PATCH")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler


def server_logs(server: FakeApiServer, ns: str, name: str, q: dict) -> str:
    server.store.get(_BY_PATH[("", "v1", "pods")], ns, name)
    path = server.log_files.get((ns, name))
    if not path:
        raise ApiError(400, "BadRequest", f'container "worker" in pod "{name}" is waiting to start: ContainerCreating')
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    if q.get("tailLines"):
        text = "".join(text.splitlines(keepends=True)[-int(q["tailLines"]):])
    return text
