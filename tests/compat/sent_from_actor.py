"""Monarch's ``sent_messages``: a cast made inside an actor names that actor (its ``actors.id``) as the
sender, not the client; ``view_json`` and ``shape_json`` are the region messaged (labels and a slice of
offset, sizes and strides), a mesh's ``shape_json`` its extent (``{"inner": ...}``).  Runs unchanged on
monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import json
import os
import sys
import time

from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob, TelemetryConfig


class Target(Actor):
    @endpoint
    def ping(self) -> None:
        pass


class Caller(Actor):
    @endpoint
    def call_target(self, target: Target) -> None:
        target.slice(gpus=1).ping.call().get()


def until(sql: str, n: int) -> list:
    rows: list = []
    for _ in range(300):
        rows = state.query_engine_client.query(sql)["rows"]
        if len(rows) >= n:
            break
        time.sleep(0.2)
    return rows


job = ProcessJob({"hosts": 1}).enable_telemetry(TelemetryConfig(dashboard_port=0, retention_secs=0))
# torchmonarch prints its mesh admin server's banner on stdout as the job starts: not what is compared.
sys.stdout.flush()
saved = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
try:
    state = job.state(cached_path=None)
finally:
    os.dup2(saved, 1)
    os.close(saved)
try:
    procs = state.hosts.spawn_procs(per_host={"gpus": 3}, name="compat_procs")
    targets = procs.spawn("compat_targets", Target)
    caller = procs.slice(gpus=0).spawn("compat_caller", Caller)
    caller.call_target.call_one(targets).get()
    [target_mesh] = until("SELECT id, shape_json FROM meshes WHERE given_name = 'compat_targets'", 1)
    print("target mesh shape:", json.loads(target_mesh["shape_json"]))
    [caller_actor] = until("SELECT a.id FROM actors a JOIN meshes m ON a.mesh_id = m.id "
                           "WHERE m.given_name = 'compat_caller'", 1)
    sent = until(f"SELECT sender_actor_id, view_json, shape_json FROM sent_messages "
                 f"WHERE actor_mesh_id = {target_mesh['id']}", 1)
    for s in sent:
        print("sent by the caller:", s["sender_actor_id"] == caller_actor["id"])
        # (The stride of a dimension of size 1 is never stepped: 0.7.0 keeps the whole mesh's, monarch
        # the slice's row-major one.)
        for column in ("view_json", "shape_json"):
            region = json.loads(s[column])
            print(f"  {column}:", region["labels"], region["slice"]["offset"], region["slice"]["sizes"])
finally:
    job.kill()
