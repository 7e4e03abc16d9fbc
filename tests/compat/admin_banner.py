"""A job whose mesh admin API is on says where it listens, on stdout, as its ``state()`` starts it: a
line ``Mesh admin server listening on URL`` with the URL ``JobState.admin_url`` holds (what
Monarch's example programs tell their users to read, "the address printed by the example").
Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import os
import sys
import tempfile
import urllib.request

from monarch.job import MeshAdminConfig, ProcessJob, TelemetryConfig

job = ProcessJob({"hosts": 1}).enable_telemetry(
    TelemetryConfig(dashboard_port=0), mesh_admin_config=MeshAdminConfig(admin_addr="127.0.0.1:0"))
with tempfile.TemporaryDirectory() as d:
    said = os.path.join(d, "stdout")
    sys.stdout.flush()
    saved = os.dup(1)
    out = os.open(said, os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(out, 1)
    try:
        state = job.state(cached_path=None)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(out)
        os.close(saved)
    lines = open(said).read().splitlines()
try:
    url = state.admin_url
    print("says where it listens:", f"Mesh admin server listening on {url}" in lines)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/v1/root", timeout=60) as r:
        print("answers there:", r.status)
finally:
    job.kill()
print("done")
