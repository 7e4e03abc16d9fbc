"""The rest of the mesh admin API over HTTP, in a real job: the OpenAPI document (every route it lists
answers, every $ref resolves), a proc's settings, a stored py-spy dump read back with SQL, a profile
as an SVG flamegraph, and the error envelope of each with bad input."""

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

from monarch.actor import Actor, endpoint
from monarch.config import configure
from monarch.job import MeshAdminConfig, ProcessJob


class Spinner(Actor):
    @endpoint
    def spin(self, until: str) -> int:
        """Busy until the file ``until`` exists, so a profile has samples of it (py-spy leaves idle threads out)."""
        n = 0
        while not os.path.exists(until):
            n += 1
        return n


configure(stop_actor_timeout="7s")  # the procs inherit it: a proc's settings show it came from here
with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
configure(mesh_admin_addr=f"127.0.0.1:{port}")  # where the API listens when MeshAdminConfig names nowhere
job = ProcessJob({"hosts": 1}).enable_admin(MeshAdminConfig())
state = job.state(cached_path=None)
procs = state.hosts.spawn_procs(per_host={"procs": 1})
spinner = procs.spawn("spinner", Spinner)
open("stop", "w").close()
spinner.spin.call(os.path.abspath("stop")).get()
os.remove("stop")
base = state.admin_url
print("listens where configured:", base == f"http://127.0.0.1:{port}")


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


def error(path: str, method: str = "GET", body: object = None) -> str:
    code, _, data = http(method, path, body)
    return f"{code} {json.loads(data)['error']['code']}"


# -- the OpenAPI document ----
code, ctype, data = http("GET", "/v1/openapi.json")
spec = json.loads(data)
print("openapi:", code, ctype, spec["openapi"], sorted(spec["paths"]) == sorted(set(spec["paths"])))


def refs(node: object) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if "$ref" in node else []) + [r for v in node.values() for r in refs(v)]
    return [r for v in node for r in refs(v)] if isinstance(node, list) else []


schemas = spec["components"]["schemas"]
print("refs resolve:", all(r.removeprefix("#/components/schemas/") in schemas for r in refs(spec)))
root = json.loads(http("GET", "/v1/root")[2])
host = json.loads(http("GET", "/v1/" + enc(root["children"][0]))[2])
proc = host["children"][0]
fill = {"{reference}": enc(root["children"][0]), "{proc_reference}": enc(proc)}
bodies = {"/v1/query": {"sql": "SELECT 1 AS one"},
          "/v1/pyspy_profile_svg/{proc_reference}": {"duration_s": 1, "rate_hz": 50, "native": False,
                                                     "threads": False, "nonblocking": False}}
answered = []
busy = spinner.spin.call(os.path.abspath("swept"))
for path, ops in sorted(spec["paths"].items()):
    url = path
    for k, v in fill.items():
        url = url.replace(k, v)
    for method in ops:
        c, _, body = http(method.upper(), url, bodies.get(path, {}) if method == "post" else None)
        answered.append(c == 200)
        if c != 200:
            print("not answered:", method, url, c, body[:300])
print("every route answers:", len(answered), all(answered))
open("swept", "w").close()
busy.get()
print("skill:", http("GET", "/SKILL.md")[1], base in http("GET", "/SKILL.md")[2].decode())

# -- a proc's settings ----
code, ctype, data = http("GET", "/v1/config/" + enc(proc))
entries = {e["name"]: e for e in json.loads(data)["entries"]}
names = [e["name"] for e in json.loads(data)["entries"]]
stop = entries["hyperactor::config::stop_actor_timeout"]
print("config:", code, ctype, names == sorted(names), stop["value"], stop["source"], stop["changed_from_default"])
delivery = entries["hyperactor::config::message_delivery_timeout"]
print("default:", delivery["value"], delivery["source"], delivery["env_var"])

# -- a stored dump ----
code, _, data = http("POST", "/v1/pyspy_dump/" + enc(proc))
dump_id = json.loads(data)["dump_id"]
print("dump:", code, len(dump_id))


def sql(text: str) -> list:
    return json.loads(http("POST", "/v1/query", {"sql": text})[2])["rows"]


dumps = sql(f"SELECT proc_ref, binary FROM pyspy_dumps WHERE dump_id = '{dump_id}'")
print("stored:", dumps == [{"proc_ref": proc, "binary": "py-spy"}],
      sql(f"SELECT count(*) > 0 AS some FROM pyspy_frames WHERE dump_id = '{dump_id}'"),
      sql(f"SELECT count(*) > 0 AS some FROM pyspy_stack_traces WHERE dump_id = '{dump_id}' "
          "AND thread_name = 'actor-spinner'"))

# -- a profile ----
busy = spinner.spin.call(os.path.abspath("profiled"))
time.sleep(0.5)
code, ctype, data = http("POST", "/v1/pyspy_profile_svg/" + enc(proc),
                         {"duration_s": 2, "rate_hz": 100, "native": False, "threads": False, "nonblocking": False})
print("profile:", code, ctype, data.lstrip().startswith(b"<?xml") and b"<svg" in data, b"spin" in data)
open("profiled", "w").close()
busy.get()

# -- errors ----
good = {"duration_s": 1, "rate_hz": 100, "native": False, "threads": False, "nonblocking": False}
configure(mesh_admin_tree_timeout="0s")
print("tree past mesh_admin_tree_timeout:", error("/v1/tree"))
configure(mesh_admin_tree_timeout="10s")
print("bad duration:", error("/v1/pyspy_profile_svg/" + enc(proc), "POST", {**good, "duration_s": 0}))
print("bad rate:", error("/v1/pyspy_profile_svg/" + enc(proc), "POST", {**good, "rate_hz": 5000}))
print("missing field:", error("/v1/pyspy_profile_svg/" + enc(proc), "POST", {"duration_s": 1}))
print("bad reference:", error("/v1/config/nonsense"), error("/v1/pyspy/nonsense"),
      error("/v1/pyspy_dump/nonsense", "POST"))
gone = proc.rsplit("/", 1)[0] + "/1"
print("no such proc:", error("/v1/config/" + enc(gone)), error("/v1/pyspy_dump/" + enc(gone), "POST"),
      error("/v1/pyspy_profile_svg/" + enc(gone), "POST", good))
job.kill()
