"""The mesh admin API of this host (``_spawn_admin``, Monarch's ``monarch._src.actor.host_mesh``)
lists this program's procs, and those its procs spawned, but no other program's: in Monarch each
client owns its host, and here another script on this machine shares its host agent.  Runs
unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them)."""

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request

from monarch._src.actor.host_mesh import _spawn_admin
from monarch.actor import Actor, endpoint, this_host

NEIGHBOUR = """
import os, sys
from monarch.actor import Actor, endpoint, this_host

class Idle(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

procs = this_host().spawn_procs(per_host={"gpus": 2})
print("ready", *procs.spawn("idle", Idle).pid.call().get().values(), flush=True)
sys.stdin.read()
procs.stop().get()
"""


class Parent(Actor):
    """Spawns a proc mesh of its own from inside a proc (a nested mesh)."""

    @endpoint
    async def spawn_child(self) -> int:
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.child = self.procs.spawn("child", Parent)
        return await self.child.pid.call_one()

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def get(base: str, ref: str) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{base}/v1/{urllib.parse.quote(ref, safe='')}", timeout=60) as r:
        return json.loads(r.read())


neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
try:
    line = neighbour.stdout.readline().split()
    print("neighbour ready:", line[:1], len(line[1:]))
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)  # Monarch's admin prints a banner on fd 1 as it starts
    try:
        admin_url, _ref = _spawn_admin([this_host()], admin_addr="127.0.0.1:0").get()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    base = "http://127.0.0.1:" + admin_url.rsplit(":", 1)[1]
    procs = this_host().spawn_procs(per_host={"replica": 2})
    parents = procs.spawn("parent", Parent)
    print("own procs answer:", len(parents.pid.call().get().values()))
    print("nested proc answers:", parents.slice(replica=0).spawn_child.call_one().get() > 0)
    listed = [p for h in get(base, "root")["children"] for p in get(base, h).get("children", [])]
    # Monarch's host also lists its own service proc and the client's proc (ours has neither)
    print("procs listed:", len([p for p in listed if not p.startswith(("service", "local"))]))
    procs.stop().get()
finally:
    neighbour.stdin.close()
    neighbour.wait(timeout=120)
print("done")
