"""The mesh admin API's shapes, as a tool written against Monarch's reads them: runs unchanged on
monarch and on torchmonarch 0.7.0, and prints only what both must answer alike (keys, status and
error codes, a setting's name and default), never their references or values that differ."""

import json
import urllib.error
import urllib.parse
import urllib.request

from monarch.actor import Actor, endpoint
from monarch.job import MeshAdminConfig, ProcessJob


class Probe(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


job = ProcessJob({"hosts": 1}).enable_admin(MeshAdminConfig())
state = job.state(cached_path=None)
procs = state.hosts.spawn_procs(per_host={"procs": 1})
probe = procs.spawn("probe", Probe)
probe.ping.call().get()
base = state.admin_url


def http(method: str, path: str, body: object = None) -> tuple[int, str, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def enc(ref: str) -> str:
    return urllib.parse.quote(ref, safe="")


def node(ref: str) -> dict:
    return json.loads(http("GET", "/v1/" + enc(ref))[2])


def error(method: str, path: str, body: object = None) -> str:
    code, ctype, data = http(method, path, body)
    return f"{code} {ctype} {json.loads(data)['error']['code']}"


spec = json.loads(http("GET", "/v1/openapi.json")[2])
routes = ["/v1/root", "/v1/{reference}", "/v1/admin", "/v1/schema", "/v1/schema/admin", "/v1/schema/error",
          "/v1/tree", "/v1/query", "/v1/pyspy/{proc_reference}", "/v1/pyspy_dump/{proc_reference}",
          "/v1/pyspy_profile_svg/{proc_reference}", "/v1/config/{proc_reference}"]
print("openapi:", spec["openapi"], sorted(spec["info"]), all(r in spec["paths"] for r in routes))
print("operations:", sorted(op["operationId"] for r in routes for op in spec["paths"][r].values()))
print("schemas:", all(s in spec["components"]["schemas"] for s in
                      ("NodePayload", "ApiErrorEnvelope", "AdminInfo", "PySpyResult", "PySpyProfileOpts",
                       "PyspyDumpAndStoreResponse", "QueryRequest", "QueryResponse")))
print("skill:", http("GET", "/SKILL.md")[1])

# The proc that runs the probe: the host's child whose children name it.
host = node(node("root")["children"][0])
proc = next(p for p in host["children"] if any("probe" in a for a in node(p)["children"]))
code, ctype, data = http("GET", "/v1/config/" + enc(proc))
entries = json.loads(data)["entries"]
print("config:", code, ctype, sorted(entries[0]), [e["name"] for e in entries] == sorted(e["name"] for e in entries))
delivery = next(e for e in entries if e["name"] == "hyperactor::config::message_delivery_timeout")
print("delivery:", delivery["default_value"], delivery["env_var"], type(delivery["changed_from_default"]).__name__)
code, ctype, data = http("GET", "/v1/pyspy/" + enc(proc))
print("pyspy:", code, ctype, [k in ("Ok", "BinaryNotFound", "Failed") for k in json.loads(data)])
good = {"duration_s": 1, "rate_hz": 100, "native": False, "threads": False, "nonblocking": False}
print("profile, no duration:", error("POST", "/v1/pyspy_profile_svg/" + enc(proc), {**good, "duration_s": 0}))
print("config, not a proc:", error("GET", "/v1/config/nonsense"))
print("pyspy, not a proc:", error("GET", "/v1/pyspy/nonsense"))
print("missing node:", error("GET", "/v1/nonexistent_ref_xxxx"))
job.kill()
