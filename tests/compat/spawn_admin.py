"""``_spawn_admin`` (``monarch._src.actor.host_mesh``), as Monarch's tests use it: a mesh admin API
over host meshes got without a job (here one worker of ``attach_to_workers``), bound where
``monarch.config``'s ``mesh_admin_addr`` says; its URL is also left in ``MONARCH_ADMIN_URL``, and
its root names the hosts.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.request

from monarch._src.actor.host_mesh import _spawn_admin
from monarch.actor import attach_to_workers
from monarch.config import configure

configure(mesh_admin_addr="127.0.0.1:0")
with tempfile.TemporaryDirectory() as d:
    address = f"ipc://{d}/worker"
    code = ("from monarch.actor import run_worker_loop_forever; "
            f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')")
    worker = subprocess.Popen([sys.executable, "-c", code])
    try:
        hosts = attach_to_workers(ca="trust_all_connections", workers=[address])
        banner = os.path.join(d, "banner")
        saved = os.dup(1)
        out = os.open(banner, os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(out, 1)
        try:
            url, _ref = _spawn_admin([hosts.slice(hosts=0)]).get()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(out)
        print("says where it listens:", f"listening on {url}" in open(banner).read())
        print("bound where configured:", url.split("://", 1)[-1].split(":")[0] in ("127.0.0.1", "localhost"),
              ":1729" not in url)
        print("MONARCH_ADMIN_URL:", os.environ.get("MONARCH_ADMIN_URL") == url)
        with urllib.request.urlopen(url + "/v1/root", timeout=60) as r:
            root = json.load(r)
        print("root answers:", r.status, "has children:", len(root.get("children", [])) >= 1)
        try:
            _spawn_admin([])
        except ValueError as e:
            print("no host meshes:", e)
    finally:
        worker.kill()
        worker.wait()
print("done")
