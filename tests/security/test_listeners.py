"""TCP listeners of monarch's own (not ZeroMQ's): where they bind, and what another local user's idle
connections do to them.

ZeroMQ's listeners close a connection that has not proved a key within 3 s (``test_flood.py``); the
ones below read a request of their own, so each holds at most a fixed number of connections that
have not sent one (one more closes the oldest), and each of those has a deadline: a flood costs
them a bounded number of descriptors and threads, and a client that speaks at once is served.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLOOD = textwrap.dedent('''
    import socket, sys, time
    socks = []
    for _ in range(int(sys.argv[3])):
        try:
            socks.append(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5))
        except OSError as e:
            print("connect failed:", e, flush=True)
            break
    print(len(socks), "open", flush=True)
    time.sleep(120)
''')


def _sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


#: A job's HTTP server (telemetry / mesh admin), as ``Job.enable_admin`` and ``_spawn_admin`` start it.
JOB_SERVER = textwrap.dedent('''
    import sys, time
    from monarch._workbench.job_services import JobServer, _Hosts
    server = JobServer(_Hosts([], rt=None), telemetry=False, admin=True)
    print(server.url, flush=True)
    sys.stdin.read()
''')


def test_a_jobs_http_server_binds_loopback_and_idle_connections_from_another_user_are_capped(attacker, shared):
    server = subprocess.Popen([sys.executable, "-c", JOB_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": ROOT})
    flood = None
    try:
        url = server.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url  # loopback unless admin_addr says otherwise
        port = url.rpartition(":")[2]
        sockets, threads = _sockets(server.pid), _threads(server.pid)
        script = os.path.join(shared, "flood.py")
        with open(script, "w") as f:
            f.write(FLOOD)
        flood = attacker.popen(["/usr/bin/python3", script, "127.0.0.1", port, "300"], stdout=subprocess.PIPE,
                               text=True)
        line = flood.stdout.readline()
        assert line.endswith(" open\n") and int(line.split()[0]) > 32, line
        # While all stay open the server comes to hold at most 32 of them, with a thread each at most.
        while _sockets(server.pid) > sockets + 32 or _threads(server.pid) > threads + 32:
            time.sleep(0.1)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url + "/v1/schema/admin", timeout=60) as r:
            assert json.loads(r.read())["title"] == "AdminInfo"
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        server.stdin.close()
        server.wait(timeout=60)
