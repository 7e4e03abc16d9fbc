"""Monarch's ``metric_sums`` table: a counter the client adds to, before it spawns any proc, is queryable
through the job's ``query_engine_client`` as one delta sum per add with the 'monarch' scope and the
attributes given (``state.query_engine`` stays None).  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import json
import os
import sys
import time

import monarch.actor
from monarch.job import ProcessJob, TelemetryConfig

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
    print("query_engine:", state.query_engine)
    served = monarch.actor.get_meter().create_counter("compat.served")
    served.add(2, {"route": "a"})
    served.add(3, {"route": "b"})
    rows: list = []
    for _ in range(300):
        rows = state.query_engine_client.query(
            "SELECT scope_name, temporality, is_monotonic, attributes_json, sum_u64 FROM metric_sums "
            "WHERE name = 'compat.served'")["rows"]
        if len(rows) >= 2:
            break
        time.sleep(0.2)
    for r in sorted(rows, key=lambda r: r["sum_u64"]):
        print(r["scope_name"], r["temporality"], r["is_monotonic"], json.loads(r["attributes_json"]), r["sum_u64"])
finally:
    job.kill()
