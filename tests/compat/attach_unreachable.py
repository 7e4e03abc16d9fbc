"""``attach_to_workers`` on a worker address nothing serves: as in Monarch it fails closed within
``mesh_attach_config_timeout`` yet returns a host mesh; its ``initialized`` raises a RuntimeError
that says the attach failed and names the worker.  Runs unchanged on monarch and on torchmonarch
0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import tempfile

from monarch.actor import attach_to_workers
from monarch.config import configured

with configured(mesh_attach_config_timeout="500ms"), tempfile.TemporaryDirectory() as d:
    hosts = attach_to_workers(ca="trust_all_connections", workers=[f"ipc://{d}/nobody_here"])
    print("returned:", type(hosts).__name__)
    for attempt in ("first", "second"):
        try:
            hosts.initialized.get()
            print(attempt, "look: ready?")
        except Exception as e:
            print(attempt, "look:", type(e).__name__,
                  str(e).startswith("attach failed: config push failed during attach"),
                  f"{d}/nobody_here" in str(e))
print("done")
