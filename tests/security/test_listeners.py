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

from tests.security.conftest import FLOOD, open_sockets

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))





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


def test_a_jobs_http_server_binds_loopback_answers_no_other_user_and_caps_idle_connections(attacker, shared):
    server = subprocess.Popen([sys.executable, "-c", JOB_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": ROOT})
    flood = None
    try:
        url = server.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url  # loopback unless admin_addr says otherwise
        port = url.rpartition(":")[2]
        sockets, threads = open_sockets(server.pid), _threads(server.pid)
        script = os.path.join(shared, "flood.py")
        with open(script, "w") as f:
            f.write(FLOOD)
        flood = attacker.popen(["/usr/bin/python3", script, "127.0.0.1", port, "300"], stdout=subprocess.PIPE,
                               text=True)
        line = flood.stdout.readline()
        assert line.endswith(" open\n") and int(line.split()[0]) > 32, line
        # While all stay open the server comes to hold at most 32 of them, with a thread each at most.
        while open_sockets(server.pid) > sockets + 32 or _threads(server.pid) > threads + 32:
            time.sleep(0.1)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url + "/v1/schema/admin", timeout=60) as r:
            assert json.loads(r.read())["title"] == "AdminInfo"
        # Its answers (the job's logs, telemetry, stacks) are its owner's: another user gets a 403 line.
        probe = os.path.join(shared, "get.py")
        with open(probe, "w") as f:
            f.write("import sys, urllib.error, urllib.request\n"
                    "o = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
                    "try:\n    print(o.open(sys.argv[1], timeout=30).status)\n"
                    "except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode().strip())\n")
        for path in ("/v1/tree", "/SKILL.md", "/v1/schema/admin"):
            r = attacker.run(f"/usr/bin/python3 {probe} {url}{path}")
            assert r.stdout.strip() == "403 this job's HTTP server answers only its owner's processes", r.stdout
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        server.stdin.close()
        server.wait(timeout=60)


#: ``monarch dashboard --web``'s server (the reservation it would show does not matter here: no app
#: starts for a request that is refused).
DASHBOARD = ("from monarch_cli.commands.dashboard import _serve_web; import sys; "
             "_serve_web('/nonexistent', '127.0.0.1', int(sys.argv[1]))")

PROBE = textwrap.dedent('''
    import sys, urllib.error, urllib.request
    base = sys.argv[1]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for path, headers in [("/", {}), ("/?token=" + "A" * 32, {}), ("/static/js/textual.js", {}),
                          ("/ws?width=80&height=24", {"Connection": "Upgrade", "Upgrade": "websocket",
                                                      "Sec-WebSocket-Version": "13",
                                                      "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}),
                          ("/", {"Cookie": "monarch_dashboard_" + base.rpartition(":")[2] + "=guess"})]:
        try:
            with opener.open(urllib.request.Request(base + path, headers=headers), timeout=30) as r:
                print(path, r.status)
        except urllib.error.HTTPError as e:
            print(path, e.code, e.read().decode().strip())
''')


def test_the_web_dashboard_on_loopback_admits_no_other_user(attacker, shared):
    """Loopback is reachable by every user of the machine; the dashboard behind it reads your logs,
    stops runs and opens shells as you.  Without the token it printed, another user gets 403s and
    no app is started for them."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", DASHBOARD, str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT},
                              start_new_session=True)
    try:
        line = server.stderr.readline()
        assert line.startswith(f"monarch dashboard on http://127.0.0.1:{port}/?token="), line
        url = line.split()[3]
        base = f"http://127.0.0.1:{port}"
        script = os.path.join(shared, "probe.py")
        with open(script, "w") as f:
            f.write(PROBE)
        for _ in range(300):  # the server binds after printing its address
            r = attacker.run(f"/usr/bin/python3 {script} {base}", check=False)
            if "Connection refused" not in r.stderr:
                break
            time.sleep(0.1)
        lines = r.stdout.splitlines()
        assert len(lines) == 5 and all(" 403 monarch dashboard: open the address" in x for x in lines), \
            r.stdout + r.stderr
        assert psutil_children(server.pid) == []  # no app process was started for them
        # The owner, with the printed address, gets the page and the cookie its websocket will use.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=60) as page:
            assert page.status == 200 and f"monarch_dashboard_{port}=" in page.headers["Set-Cookie"]
            assert "SameSite=Strict" in page.headers["Set-Cookie"] and "HttpOnly" in page.headers["Set-Cookie"]
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


def psutil_children(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


#: The port-forward of a Kubernetes reservation (its SOCKS5 proxy on loopback), as
#: ``python -m monarch_schedulers.kube_forward`` serves it; no API server is reached before a
#: connection has shown the token.
KUBE_FORWARD = textwrap.dedent("""
    import json, os, socket, sys
    from monarch_agents import tunnel
    from monarch_agents.keys import JobKeys
    from monarch_schedulers.kube_forward import Forwarder
    job = sys.argv[1]
    with open(os.path.join(job, "keys.json"), "w") as f:
        json.dump(JobKeys.generate().as_dict(), f)
    with open(os.path.join(job, "kubeconfig"), "w") as f:
        f.write("apiVersion: v1\\nkind: Config\\ncurrent-context: x\\n"
                "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\\n"
                "users: [{name: u, user: {token: t}}]\\ncontexts: [{name: x, context: {cluster: c, user: u}}]\\n")
    fw = Forwarder(job, "m", "default", 1, kubeconfig=os.path.join(job, "kubeconfig"))
    socks = socket.create_server(("127.0.0.1", 0))
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(os.path.join(job, "control"))
    control.listen(4)
    fw.start(socks, control)
    print(socks.getsockname()[1], fw.token, flush=True)
    sys.stdin.read()
    fw.stop(__import__("time").monotonic() + 5)
""")


def test_a_kubernetes_port_forwards_socks_proxy_caps_idle_connections_from_another_user(attacker, shared, tmp_path):
    fw = subprocess.Popen([sys.executable, "-c", KUBE_FORWARD, str(tmp_path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    flood = None
    try:
        port, token = fw.stdout.readline().split()
        sockets, threads = open_sockets(fw.pid), _threads(fw.pid)
        script = os.path.join(shared, "flood.py")
        with open(script, "w") as f:
            f.write(FLOOD)
        # Slowly: a SOCKS greeting that names 255 methods, then one byte of them every 3 s, which no
        # read's own timeout (10 s) ever ends.
        flood = attacker.popen(["/usr/bin/python3", script, "127.0.0.1", port, "300", "trickle"],
                               stdout=subprocess.PIPE, text=True)
        line = flood.stdout.readline()
        assert line.endswith(" open\n") and int(line.split()[0]) > 16, line
        # While all stay open the proxy comes to hold at most 16 of them, with a thread each at most.
        while open_sockets(fw.pid) > sockets + 16 or _threads(fw.pid) > threads + 16:
            time.sleep(0.1)
        # The job's own client still authenticates at once (RFC 1929, the relay token as password).
        import socket

        with socket.create_connection(("127.0.0.1", int(port)), timeout=60) as s:
            s.sendall(b"\x05\x01\x02")
            assert s.recv(2) == b"\x05\x02"
            s.sendall(b"\x01\x01m" + bytes([len(token)]) + token.encode())
            assert s.recv(2) == b"\x01\x00"
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        fw.stdin.close()
        fw.wait(timeout=60)


@pytest.fixture
def other_machine():
    """A network namespace joined to this one by a veth pair: a process in it reaches this machine's
    address there as a peer on another machine does (not in this namespace's /proc/net/tcp)."""
    import shutil
    import uuid

    if os.getuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root with ip and nsenter (as in CI) to make a network namespace")
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"mnsec{tag}", f"mnh{tag}", f"mnt{tag}"
    # Off the ranges monarch's own namespaces use (10.213/16, 10.231/16), which other runs may hold now.
    base, last = f"10.252.{int(tag[:2], 16)}", int(tag[2:4], 16) & 0xFC
    mine, theirs = f"{base}.{last + 1}", f"{base}.{last + 2}"
    cmds = [["ip", "netns", "add", ns], ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
            ["ip", "link", "set", there, "netns", ns], ["ip", "addr", "add", f"{mine}/30", "dev", here],
            ["ip", "link", "set", here, "up"],
            ["ip", "-n", ns, "addr", "add", f"{theirs}/30", "dev", there], ["ip", "-n", ns, "link", "set", there, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"]]
    try:
        for c in cmds:
            subprocess.run(c, check=True, capture_output=True)
        yield ns, mine
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes its veth end, and so the pair
        subprocess.run(["ip", "link", "del", here], capture_output=True)


#: The mesh admin API bound beyond loopback, as ``MeshAdminConfig(admin_addr="0.0.0.0:0")`` starts it.
WIDE_SERVER = JOB_SERVER.replace("admin=True)", "admin=True, bind='0.0.0.0')").replace(
    "print(server.url, flush=True)", "print(server.url, getattr(server, 'token_file', None), flush=True)")


def test_a_jobs_http_server_beyond_loopback_answers_other_machines_only_with_its_token(attacker, other_machine,
                                                                                      shared, tmp_path):
    ns, address = other_machine
    server = subprocess.Popen([sys.executable, "-c", WIDE_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        url, token_file = server.stdout.readline().split()
        assert url.startswith("http://0.0.0.0:"), url
        said = server.stderr.readline()  # printed as it started: where the token is, and how to use it
        there = f"http://{address}:{url.rpartition(':')[2]}"
        probe = os.path.join(shared, "get.py")
        with open(probe, "w") as f:
            f.write("import sys, urllib.error, urllib.request\n"
                    "o = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
                    "h = {'Authorization': sys.argv[2]} if len(sys.argv) > 2 else {}\n"
                    "try:\n    print(o.open(urllib.request.Request(sys.argv[1], headers=h), timeout=30).status)\n"
                    "except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode().strip())\n")
        from tests.security.conftest import RUNUSER

        def from_there(path: str, *auth: str) -> str:
            r = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", RUNUSER, "-u", attacker.name, "--",
                                "/usr/bin/python3", probe, there + path, *auth], capture_output=True, text=True,
                               timeout=120, env={"PATH": "/usr/bin:/bin"}, cwd="/")
            return r.stdout.strip() or r.stderr

        refused = "401 this job's HTTP server answers other machines only with its bearer token"
        for path in ("/v1/tree", "/SKILL.md", "/v1/schema/admin"):
            assert from_there(path).startswith(refused), from_there(path)
        assert from_there("/v1/tree", "Bearer " + "A" * 43).startswith(refused)
        # Its owner has the token, in a file of theirs only they may read.
        st = os.stat(token_file)
        assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o600, oct(st.st_mode)
        with open(token_file) as f:
            token = f.read().strip()
        assert from_there("/v1/schema/admin", f"Bearer {token}") == "200"
        # The owner on the other machine, running the example the server printed (with bash), gets in,
        # and the token is never in curl's arguments (which `ps` shows every user).
        example = said[said.index("(curl ") + 1:said.rindex(")")].replace(url, there)
        argv_file, bindir = str(tmp_path / "curl-argv"), str(tmp_path / "bin")
        os.makedirs(bindir)
        with open(os.path.join(bindir, "curl"), "w") as f:
            f.write(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {argv_file}\nexec /usr/bin/curl -sS -w '\\n%{{http_code}}\\n' \"$@\"\n")
        os.chmod(os.path.join(bindir, "curl"), 0o700)
        r = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "bash", "-c", example], capture_output=True,
                           text=True, timeout=120, env={"PATH": f"{bindir}:/usr/bin:/bin"}, cwd="/")
        assert r.returncode == 0 and r.stdout.splitlines()[-1] == "200", (example, r)
        with open(argv_file) as f:
            assert token not in f.read()
        # Another user of this machine gets its 403 at that address too, token or not.
        r = attacker.run(f"/usr/bin/python3 {probe} {there}/v1/tree")
        assert r.stdout.startswith("403 "), r.stdout
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    assert not os.path.exists(token_file)  # removed with the server
    assert f"answers other machines only with the bearer token in {token_file}" in said
