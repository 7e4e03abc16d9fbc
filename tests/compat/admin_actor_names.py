"""Finding a workload's procs through the mesh admin API by its actors' names, as Monarch's admin
tools do (its python/examples/verify_pyspy.py): walk /v1/root -> hosts -> procs, and keep a proc
where some actor reference's last comma-separated part (the whole reference where it has no
comma) starts with the actor's name.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import json
import os
import sys
import urllib.parse
import urllib.request

from monarch.actor import Actor, endpoint
from monarch.job import MeshAdminConfig, ProcessJob

opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Probe(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def node(base: str, ref: str) -> dict:
    with opener.open(f"{base}/v1/{urllib.parse.quote(ref, safe='')}", timeout=60) as r:
        return json.loads(r.read())


def actor_name(ref: str) -> str:
    return ref.rsplit(",", 1)[-1] if "," in ref else ref


job = ProcessJob({"hosts": 1}).enable_admin(MeshAdminConfig(admin_addr="127.0.0.1:0"))
sys.stdout.flush()
saved = os.dup(1)
os.dup2(2, 1)  # the admin server's banner (on stdout, as it starts) is not what is compared
try:
    state = job.state(cached_path=None)
finally:
    os.dup2(saved, 1)
    os.close(saved)
try:
    procs = state.hosts.spawn_procs(per_host={"replica": 2})
    probes = procs.spawn("probe_worker", Probe)
    print("answers:", sorted(probes.ping.call().get().values()))
    found = []
    for host in node(state.admin_url, "root")["children"]:
        for proc in node(state.admin_url, host)["children"]:
            names = [actor_name(a) for a in node(state.admin_url, proc)["children"]]
            if any(n.startswith("probe_worker") for n in names):
                found.append(proc)
    print("procs found by their actors' names:", len(found))
    print("each one's page:", all("children" in node(state.admin_url, p) for p in found))
finally:
    job.kill()
print("done")
