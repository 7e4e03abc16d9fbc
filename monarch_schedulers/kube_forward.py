"""The port-forward of a Kubernetes reservation whose pods this machine cannot reach directly.

``monarch serve --scheduler kubernetes`` starts it (one process per reservation, beside the
job's files) when the pods' IPs do not answer from here: a laptop outside the cluster.  Every
``monarch`` command and controller program of the reservation then goes through it, for as long
as the reservation lives (``monarch stop`` ends it):

* a SOCKS5 proxy on loopback (its password is the job's relay token): each connection a client opens to a pod's address becomes a
  port-forward stream to that pod (``pods/NAME/portforward`` through the API server, as
  ``kubectl port-forward`` does), opened with the official ``kubernetes`` client;
* a Unix socket (0600, in the job's folder) where a client process asks for an address in the
  cluster that stands for it: the relay of host rank 0's agent (``monarch_agents.services.relay``)
  listens there, and each connection a pod makes to it comes back through a stream this
  process opens (see ``monarch_agents.tunnel``).

It writes ``route.json`` in the job's folder once both listen; clients read it from the
reservation (``JobRecord.route``).  Its log is ``forward.log`` beside it.

    python -m monarch_schedulers.kube_forward --job-dir DIR --mesh NAME --namespace NS \\
        --relay-port PORT [--kubeconfig PATH] [--context CTX]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import struct
import threading
import time

from monarch_agents import tunnel
from monarch_agents.files import runtime_dir, write_atomic
from monarch_agents.unproven import UnprovenConnections
from monarch_schedulers.agent_launch import ROUTE_FILE, read_keys

log = logging.getLogger("monarch.kube_forward")

CONTROL_SOCKET = "forward.sock"
#: A Unix socket's path must fit in sun_path (108 bytes, with its NUL); deeper job folders use a short one.
_MAX_SOCKET_PATH = 100
MESH_LABEL = "monarch.pytorch.org/mesh-name"
INDEX_LABEL = "apps.kubernetes.io/pod-index"
#: How often it checks that its reservation still exists (the job folder and the pods' owner).
_CHECK_EVERY_S = 2.0
#: How long its threads get to end once it stops (a stream blocked in the API server may take longer).
_STOP_S = 2.0
#: SOCKS connections that have not shown the job's token yet, at most: one more closes the oldest
#: (each has 10 s), so another local user's idle connections hold neither a thread nor a
#: descriptor each, and a client that authenticates at once still gets through.
_UNPROVEN_MAX = 16


class Forwarder:
    """The proxy and the relay control of one reservation (see the module docstring)."""

    def __init__(self, job_dir: str, mesh: str, namespace: str, relay_port: int,
                 kubeconfig: str | None = None, context: str | None = None):
        from kubernetes import client, config

        self.job_dir = job_dir
        self.mesh = mesh
        self.namespace = namespace
        self.relay_port = relay_port
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig, context=context))
        self.token = tunnel.token(read_keys(job_dir))
        self._pods: dict[str, str] = {}  # pod IP -> pod name
        self._relay_pod = ("", "")  # host rank 0's (name, IP)
        self._lock = threading.Lock()
        self.stopped = threading.Event()
        #: What stop() wakes and joins: the listeners, every thread started here, every socket in use.
        self._tlock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._live: set[socket.socket] = set()
        #: SOCKS connections yet to show the token (the oldest is closed to make room for a newer one).
        self._unproven = UnprovenConnections(_UNPROVEN_MAX)

    # -- pods ---------------------------------------------------------------------------

    def refresh(self) -> None:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{MESH_LABEL}={self.mesh}").items
        with self._lock:
            self._pods = {p.status.pod_ip: p.metadata.name for p in pods if p.status and p.status.pod_ip}
            for p in pods:
                if (p.metadata.labels or {}).get(INDEX_LABEL) == "0" and p.status and p.status.pod_ip:
                    self._relay_pod = (p.metadata.name, p.status.pod_ip)

    def pod_at(self, ip: str) -> str | None:
        with self._lock:
            name = self._pods.get(ip)
        if name is None:  # a pod replaced since: ask again
            self.refresh()
            with self._lock:
                name = self._pods.get(ip)
        return name

    def open_stream(self, pod: str, port: int):
        """A socket carrying one TCP connection to ``pod:port`` through the API server."""
        from kubernetes.stream import portforward

        pf = portforward(self.core.connect_get_namespaced_pod_portforward, pod, self.namespace, ports=str(port))
        s = pf.socket(port)
        s.setblocking(True)
        s._monarch_pf = pf  # the stream's proxy thread lives as long as the socket is used
        return s

    # -- the SOCKS5 proxy (what ZeroMQ's ZMQ_SOCKS_PROXY speaks) ---------------------------

    def serve(self, ls: socket.socket, handle, name: str) -> None:
        """Accept on ``ls`` until it is closed; each connection to ``handle`` on a thread of its own."""
        while not self.stopped.is_set():
            try:
                conn, _ = ls.accept()
            except OSError:
                return
            self._track(conn)
            if handle == self.socks:
                self._unproven.admit(conn)
            self._spawn(handle, (conn,), name)

    # -- threads and their stop -------------------------------------------------------------

    def start(self, socks: socket.socket, control: socket.socket) -> None:
        """Serve the SOCKS proxy on ``socks`` and the relay control on ``control`` (both listening)."""
        with self._tlock:
            self._listeners = [socks, control]
        self._spawn(self.serve, (socks, self.socks, "socks"), "socks")
        self._spawn(self.serve, (control, self.client, "relay-client"), "relay-client")

    def stop(self, deadline: float) -> list[str]:
        """Stop accepting, shut every connection and stream in use, and join every thread started
        here by ``deadline`` (``time.monotonic()``).  Returns the names of those still running then
        (one blocked in a call to the API server); may be called again."""
        self.stopped.set()
        with self._tlock:
            listeners, live, threads = list(self._listeners), list(self._live), list(self._threads)
            self._listeners = []
        for s in [*listeners, *live]:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread in accept() or recv(); close() alone does not
            except OSError:
                pass  # closed already, or never connected
        for s in listeners:
            s.close()
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in threads if t.is_alive() and t is not me]

    def threads(self) -> list[threading.Thread]:
        """The threads started here that still run."""
        with self._tlock:
            return [t for t in self._threads if t.is_alive()]

    def _spawn(self, target, args: tuple, name: str) -> threading.Thread:
        return self._adopt(threading.Thread(target=target, args=args, name=name, daemon=True), start=True)

    def _adopt(self, t: threading.Thread, start: bool = False) -> threading.Thread:
        with self._tlock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            if start:
                # Under the lock: a thread not started yet reads as not alive, and another accept
                # loop's _adopt pruned it in that moment; it then ran unseen by threads() and stop().
                # (start() returns once the thread runs, before its target takes this lock.)
                t.start()
        return t

    def _track(self, *socks) -> None:
        """Sockets stop() shuts (closed ones are dropped as new ones come)."""
        with self._tlock:
            self._live = {x for x in self._live if x.fileno() != -1}
            self._live.update(x for x in socks if x is not None)

    def socks(self, conn: socket.socket) -> None:
        """One SOCKS5 connection: authenticated, then carried to the pod it names."""
        try:
            self._socks(conn)
        finally:
            self._proven(conn)

    def _proven(self, conn: socket.socket) -> None:
        self._unproven.proven(conn)

    def _socks(self, conn: socket.socket) -> None:
        def password_ok(password: str) -> bool:
            # Loopback is shared with every user of this machine: only holders of the job's keys
            # (the password is the relay token) may open streams into the cluster.
            if not tunnel.same_token(password, self.token):
                log.warning("refused a SOCKS connection without the job's token")
                return False
            self._proven(conn)  # its slot is free for the next one
            return True

        try:
            target = tunnel.socks5_accept(conn, password_ok)
            if target is None:
                return
            host, port = target
            pod = self.pod_at(host)
            if pod is None:
                log.warning("no pod of %s has the address %s", self.mesh, host)
                return tunnel.socks5_refuse(conn, 4)
            try:
                stream = self.open_stream(pod, port)
            except Exception as e:  # the API refused (the pod is gone, not running)
                log.warning("cannot port-forward to %s:%d: %s", pod, port, e)
                return tunnel.socks5_refuse(conn, 5)
            self._track(stream)
            tunnel.socks5_granted(conn)
            self._adopt(tunnel.pipe(conn, stream, name="socks"))
        except (OSError, ValueError, struct.error):
            conn.close()

    # -- the relay control (one stream per client process) -------------------------------

    def client(self, conn: socket.socket) -> None:
        """One client process: a relay address for its local endpoint, for as long as it stays connected."""
        control = None
        done = threading.Event()
        try:
            req = tunnel.read_line(conn)
            if req is None or not isinstance(req.get("local"), str):
                return
            host, _, port = req["local"].rpartition(":")
            local = (host.strip("[]"), int(port))
            pod, ip = self._relay_pod
            if not pod:
                self.refresh()
                pod, ip = self._relay_pod
            try:
                control = self.open_stream(pod, self.relay_port)
                self._track(control)
                # The heartbeat: the relay ends this client's address once the stream is silent for a
                # few beats (a port-forward whose client vanished keeps the pod's end of it open).
                tunnel.send_line(control, {"token": self.token, "listen": True, "heartbeat": tunnel.HEARTBEAT_S})
                answer = tunnel.read_line(control)
            except Exception as e:
                answer = None
                log.warning("cannot reach the relay on %s: %s", pod, e)
            if not answer or "port" not in answer:
                return tunnel.send_line(conn, {"error": f"the relay on pod {pod or '(none)'} does not answer"})
            tunnel.send_line(conn, {"advertise": f"tcp://{ip}:{answer['port']}"})
            self._spawn(self._client_gone, (conn, control), "relay-client-gone")
            self._spawn(self._heartbeat, (control, done), "relay-heartbeat")
            while True:
                ev = tunnel.read_line(control)
                if ev is None:
                    break
                if isinstance(ev.get("conn"), int):
                    self._spawn(self._back, (pod, ev["conn"], local), "relay-back")
        except OSError:
            pass
        finally:
            done.set()
            for s in (conn, control):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass

    @staticmethod
    def _client_gone(conn: socket.socket, control) -> None:
        """The client process closed its end (it exited): end its relay address too."""
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        try:
            control.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _heartbeat(self, control: socket.socket, done: threading.Event) -> None:
        """A byte on the relay's control stream every ``tunnel.HEARTBEAT_S`` until the client's relay
        address ends (``done``) or the stream fails; the relay reads silence as a vanished client."""
        while not done.wait(tunnel.HEARTBEAT_S) and not self.stopped.is_set():
            try:
                control.sendall(b"\n")
            except OSError:
                return

    def _back(self, pod: str, n: int, local: tuple[str, int]) -> None:
        """Connection ``n`` a pod made to the relay: carried to the client's own endpoint."""
        try:
            stream = self.open_stream(pod, self.relay_port)
            self._track(stream)
            tunnel.send_line(stream, {"token": self.token, "accept": n})
        except Exception as e:
            log.warning("cannot open the way back for connection %d: %s", n, e)
            return
        try:
            mine = socket.create_connection(local, timeout=5)
        except OSError:
            stream.close()  # the client process is gone
            return
        self._track(mine)
        mine.settimeout(None)
        self._adopt(tunnel.pipe(stream, mine, name="relay-back"))

    # -- lifetime ------------------------------------------------------------------------

    def alive(self) -> bool:
        """Whether the reservation this forwards for still exists (its folder and state)."""
        return os.path.exists(os.path.join(self.job_dir, "kubernetes.json"))


def control_socket_path(job_dir: str) -> str:
    """Where the control socket of ``job_dir``'s forwarder listens: in the job folder where the path fits
    a Unix socket's, else under this user's folder in the temp dir, named by the job folder."""
    path = os.path.join(job_dir, CONTROL_SOCKET)
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    import hashlib

    short = runtime_dir()
    return os.path.join(short, f"forward-{hashlib.sha256(os.fsencode(job_dir)).hexdigest()[:16]}.sock")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m monarch_schedulers.kube_forward",
                                description="the port-forward of one monarch Kubernetes reservation")
    p.add_argument("--job-dir", required=True)
    p.add_argument("--mesh", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--relay-port", type=int, required=True)
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--context", default=None)
    a = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("MONARCH_LOG", "INFO"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    fw = Forwarder(a.job_dir, a.mesh, a.namespace, a.relay_port, a.kubeconfig, a.context)
    fw.refresh()
    socks = socket.create_server(("127.0.0.1", 0))
    control_path = control_socket_path(a.job_dir)
    try:
        os.unlink(control_path)
    except FileNotFoundError:
        pass
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        control.bind(control_path)  # 0600: only this user's processes get a relay address
    finally:
        os.umask(old)
    control.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: fw.stopped.set())
    signal.signal(signal.SIGINT, lambda *_: fw.stopped.set())
    fw.start(socks, control)
    write_atomic(os.path.join(a.job_dir, ROUTE_FILE), json.dumps(
        {"via": "port-forward", "socks": "127.0.0.1:%d" % socks.getsockname()[1], "control": control_path,
         "pid": os.getpid(), "api": fw.core.api_client.configuration.host}).encode())
    log.info("forwarding for %s: socks %s, control %s", a.mesh, socks.getsockname(), control_path)
    while not fw.stopped.wait(_CHECK_EVERY_S):
        if not fw.alive():
            log.info("the reservation is gone: exiting")
            break
    late = fw.stop(time.monotonic() + _STOP_S)
    if late:
        log.info("threads still running at exit: %s", ", ".join(late))
    try:
        os.unlink(control_path)
    except OSError:
        pass


if __name__ == "__main__":
    main()
