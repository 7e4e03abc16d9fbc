"""The mesh admin API over this host's meshes, started by ``_spawn_admin`` (Monarch's
``monarch._src.actor.host_mesh``) without a job: an actor that fails poisons its proc, which counts
and lists it, and the actor's page says why.  Runs unchanged on monarch and on torchmonarch 0.7.0.

(Checks are "some proc shows it": this host's agent may show procs of other programs too.)"""

import json
import os
import sys
import threading
import time
import urllib.parse
import urllib.request

import monarch.actor
from monarch._src.actor.host_mesh import _spawn_admin
from monarch.actor import Actor, endpoint, this_host


class Crash(BaseException):
    """Not an Exception: the actor fails (supervision) instead of answering an error."""


class Worker(Actor):
    @endpoint
    async def work(self) -> int:
        return 1

    @endpoint
    async def crash(self) -> None:
        raise Crash("disk on fire")


def get(base: str, ref: str) -> dict:
    url = f"{base}/v1/{urllib.parse.quote(ref, safe='')}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=60) as r:
        return json.loads(r.read())


faulted = threading.Event()
monarch.actor.unhandled_fault_hook = lambda failure: faulted.set()
host = this_host()
# Monarch's admin prints a banner on fd 1 as it starts: to stderr, so that stdout is this program's
sys.stdout.flush()
saved = os.dup(1)
os.dup2(2, 1)
try:
    admin_url, _ref = _spawn_admin([host], admin_addr="127.0.0.1:0").get()
finally:
    os.dup2(saved, 1)
    os.close(saved)
base = "http://127.0.0.1:" + admin_url.rsplit(":", 1)[1]
print("admin url is http(s):", admin_url.split("://")[0] in ("http", "https"))
procs = host.spawn_procs(per_host={"replica": 2})
workers = procs.spawn("worker", Worker)
print("work", workers.work.call().get().values())
try:
    workers.slice(replica=0).crash.call_one().get()
except BaseException as e:  # noqa: BLE001 - whichever error reports the crash
    print("crash reported:", type(e).__name__)
print("fault hook ran:", faulted.wait(60))


def failed_worker() -> tuple[dict, dict] | None:
    """A poisoned proc and the failed worker it lists whose failure names this program's error."""
    for host_ref in get(base, "root")["children"]:
        for proc_ref in get(base, host_ref).get("children", []):
            props = get(base, proc_ref).get("properties", {}).get("Proc")
            if not props or not props["is_poisoned"]:
                continue
            for child in props["stopped_children"]:
                actor = get(base, child)["properties"]["Actor"]
                info = actor.get("failure_info")
                if "worker" in child and info and "disk on fire" in info["error_message"]:
                    return props, actor
    return None


deadline = time.monotonic() + 60
found = failed_worker()
while found is None and time.monotonic() < deadline:
    time.sleep(0.5)
    found = failed_worker()
props, actor = found
print("poisoned proc counts it:", props["failed_actor_count"] >= 1, "and lists it:", len(props["stopped_children"]) >= 1)
info = actor["failure_info"]
print("status says failed:", "failed" in actor["actor_status"].lower())
print("failure_info:", bool(info["root_cause_actor"]), bool(info["occurred_at"]), info["is_propagated"])
procs.stop().get()
print("done")
