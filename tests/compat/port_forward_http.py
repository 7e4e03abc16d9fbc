# A Monarch program in the pattern of PyTorch Monarch's PortForwarder tests (tests/test_port_forward.py)
# and its monarch.job documentation: a toy HTTP server runs on one host of a job, and a
# PortForwarder spawned on this process makes it reachable at a local port. Written against
# Monarch 0.7.0's API only; it runs unchanged there and here.
import http.server
import socket
import sys
import threading
import urllib.error
import urllib.request

from monarch.actor import Actor, endpoint, current_rank, this_proc
from monarch.job import PortForwarder, ProcessJob


class ToyWebServer(Actor):
    """Serves 'hello from rank N' on a loopback port of its host."""

    @endpoint
    def start(self) -> int:
        rank = current_rank().rank
        name = socket.gethostname()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = f"hello from rank {rank} on {name} path={self.path}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


job = ProcessJob({"hosts": 2})
hosts = job.state(cached_path=None).hosts
try:
    server_procs = hosts.slice(hosts=1).spawn_procs()
    server_port = server_procs.spawn("web", ToyWebServer).start.call_one().get()

    forwarder = this_proc().spawn("port_forwarder", PortForwarder)
    local_ports = [unused_port(), unused_port()]
    for local_port in local_ports:  # many forwards from one forwarder
        forwarder.forward.call_one(server_procs, server_port, this_proc(), f"127.0.0.1:{local_port}").get()

    for local_port in local_ports:
        for path in ("/a", "/b"):
            with urllib.request.urlopen(f"http://127.0.0.1:{local_port}{path}", timeout=30) as r:
                print(f"{local_port}{path}: {r.read().decode()}")

    forwarder.stop().get()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{local_ports[0]}/", timeout=5)
        sys.exit("the forward is still open after stop()")
    except (urllib.error.URLError, ConnectionError):
        print("forwards closed after stop()")
finally:
    job.kill()
