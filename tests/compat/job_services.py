"""A job with Monarch's telemetry and admin services: SQL over its telemetry, spans and metrics of
its actors, and a walk of the mesh admin API from /v1/root down to an actor and a proc's stacks."""

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from monarch.actor import Actor, endpoint, get_meter, span
from monarch.job import MeshAdminConfig, ProcessJob, TelemetryConfig


class Worker(Actor):
    @endpoint
    def work(self, n: int) -> int:
        with span("inner"):
            get_meter().create_counter("units").add(n, {"kind": "test"})
        return n * 2


plain = ProcessJob({"hosts": 1}).state(cached_path=None)
print("not enabled:", plain.query_engine, plain.query_engine_client, plain.telemetry_url, plain.admin_url)

job = ProcessJob({"hosts": 2}).enable_telemetry(TelemetryConfig(), mesh_admin_config=MeshAdminConfig())
state = job.state(cached_path=None)
print("enabled:", state.telemetry_url.startswith("http://127.0.0.1:"), state.admin_url.startswith("http://127.0.0.1:"))
procs = state.hosts.spawn_procs(per_host={"procs": 2})
workers = procs.spawn("worker", Worker)
print("calls:", sorted(workers.work.call(3).get().values()))


def until(sql: str, want: list) -> list:
    """Rows reach the hosts a few times a second: ask until they are all there."""
    for _ in range(300):
        rows = state.query_engine_client.query(sql)["rows"]
        if rows == want:
            return rows
        time.sleep(0.1)
    return rows


print("actors:", until("SELECT count(*) AS n FROM actors WHERE display_name LIKE 'worker%'", [{"n": 4}]))
print("spans:", until("SELECT name, count(*) AS n FROM user_spans GROUP BY name", [{"name": "inner", "n": 4}]))
print("metrics:", until("SELECT name, sum(value) AS v, min(attributes) AS a FROM metrics GROUP BY name",
                        [{"name": "units", "v": 12.0, "a": '{"kind": "test"}'}]))
print("query_engine:", state.query_engine, state.query_engine_client.query("SELECT count(*) AS n FROM hosts"))
print("query client:", job.telemetry_query_client().query("SELECT count(*) AS n FROM hosts"))


def get(path: str, *, quote: bool = True) -> dict:
    url = state.admin_url + "/v1/" + (urllib.parse.quote(path, safe="") if quote else path)
    return json.loads(urllib.request.urlopen(url, timeout=60).read())


root = get("root")
print("root:", list(root["properties"]), root["properties"]["Root"]["num_hosts"], root["children"], root["parent"])
host = get(root["children"][1])
print("host:", list(host["properties"]), host["properties"]["Host"]["num_procs"], host["parent"])
proc = get(host["children"][0])
print("proc:", list(proc["properties"]), proc["properties"]["Proc"]["num_actors"], proc["parent"] == host["identity"])
actor = get(proc["children"][0])["properties"]["Actor"]
print("actor:", actor["actor_status"], actor["actor_type"], actor["messages_processed"], actor["last_message_handler"])
try:
    get("nonexistent_ref_xxxx")
except urllib.error.HTTPError as e:
    print("missing:", e.code, json.loads(e.read())["error"]["code"])
stacks = get("pyspy/" + urllib.parse.quote(host["children"][0], safe=""), quote=False)
print("pyspy:", list(stacks), any(t["thread_name"] == "actor-worker" for t in stacks.get("Ok", {}).get("stack_traces", [])))
print("schema:", "v1" in get("schema", quote=False)["$id"], "$id" in get("schema/error", quote=False))
print("tree:", urllib.request.urlopen(state.admin_url + "/v1/tree", timeout=60).read().decode().count("actor:"))
job.kill()
try:
    urllib.request.urlopen(state.admin_url + "/v1/root", timeout=5)
except OSError:
    print("admin closed with the job")
