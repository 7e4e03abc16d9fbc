"""The FAKE cluster's kubelet: runs each bound pod's container as a process on this machine.

As a real kubelet would, it pulls the image (only images in ``images`` exist; any other gives
``ErrImagePull`` then ``ImagePullBackOff``), waits for the Secrets the pod mounts
(``ContainerCreating``), gives the pod an IP of its own (127.N.0.x, N random per cluster: one loopback address per
pod, so each agent binds its own address), fills ``env`` (values, ``fieldRef`` to
``metadata.name``/``metadata.namespace``/``status.podIP``/``metadata.labels['...']``) and expands
``$(VAR)`` in command and args, mounts each Secret volume read-only at its ``mountPath`` (files
written with ``defaultMode``, bind-mounted in a private mount namespace, so the process sees the
real path), runs the readiness probe (``tcpSocket``), restarts a container that exits
(``restartPolicy: Always``, ``restartCount``), and on deletion sends SIGTERM, waits for the grace
period, SIGKILLs, then removes the pod.

The "image" is this machine's environment: the command runs with the kubelet's PATH.
"""

from __future__ import annotations

import base64
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

from tests.fakes.kube.apiserver import _BY_PATH, ApiError, FakeApiServer, now_iso

PODS = _BY_PATH[("", "v1", "pods")]
SECRETS = _BY_PATH[("", "v1", "secrets")]

_MOUNT_SH = """
set -e
hostname "$MONARCH_FAKE_POD_HOSTNAME"
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  mount --bind -o ro "$1" "$2"; mount -o remount,bind,ro "$2"; shift 2
done
shift
exec "$@"
"""


@dataclass
class _Running:
    uid: str
    proc: subprocess.Popen | None = None
    ip: str = ""
    restarts: int = 0
    dir: str = ""
    killing_since: float | None = None
    backoff_until: float | None = None
    mounts: list[str] = field(default_factory=list)


class Kubelet:
    def __init__(self, server: FakeApiServer, images: list[str], env: dict | None = None, tick_s: float = 0.05):
        self.server = server
        self.store = server.store
        self.images = set(images)
        self.env = dict(env or os.environ)
        self.tick_s = tick_s
        self.root = tempfile.mkdtemp(prefix="fake-kubelet-")
        self.running: dict[tuple[str, str], _Running] = {}
        self._next_ip = 2
        # A /16 of loopback of this cluster's own: fake clusters of concurrent test runs on one
        # machine share its network stack, and two pods at one address would fight for its ports.
        self._net = random.randint(1, 254)
        self.made_dirs: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)

    def start(self) -> "Kubelet":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop every container (as a node drain would) and remove the kubelet's files."""
        self._stop.set()
        self._thread.join(5)
        for r in self.running.values():
            if r.proc and r.proc.poll() is None:
                _killpg(r.proc, signal.SIGKILL)
                r.proc.wait()
        self.running.clear()
        shutil.rmtree(self.root, ignore_errors=True)
        for d in reversed(self.made_dirs):
            try:
                os.removedirs(d)  # the mount point, and parents it made that are now empty
            except OSError:
                pass

    def pids(self) -> list[int]:
        return [r.proc.pid for r in self.running.values() if r.proc and r.proc.poll() is None]

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.sync()
            except ApiError:
                pass

    def sync(self) -> None:
        pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self.store.list(PODS, "")
                if p["spec"].get("nodeName")}
        for key, r in list(self.running.items()):
            pod = pods.get(key)
            if pod is None or pod["metadata"]["uid"] != r.uid:
                self._kill_now(key, r)
        for key, pod in pods.items():
            r = self.running.get(key)
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(key, pod, r)
            elif r is None or r.proc is None:
                self._start(key, pod)
            else:
                self._watch(key, pod, r)

    # -- starting ------------------------------------------------------------------------------

    def _waiting(self, key, reason: str, message: str) -> None:
        def upd(o: dict) -> None:
            o["status"]["phase"] = "Pending"
            o["status"]["containerStatuses"] = [{"name": c["name"], "ready": False, "restartCount": 0,
                                                 "image": c.get("image", ""), "imageID": "",
                                                 "state": {"waiting": {"reason": reason, "message": message}}}
                                                for c in o["spec"]["containers"]]
        pod = self.store.update(PODS, *key, upd)
        self.store.event(pod, {"ContainerCreating": "FailedMount"}.get(reason, reason), message, "Warning")

    def _start(self, key, pod: dict) -> None:
        ns, name = key
        c = pod["spec"]["containers"][0]
        if c.get("image") not in self.images:
            prev = self.running.get(key)
            reason = "ImagePullBackOff" if prev is not None else "ErrImagePull"
            self.running[key] = _Running(pod["metadata"]["uid"])
            self._waiting(key, reason, f'Back-off pulling image "{c.get("image")}"' if prev else
                          f'failed to pull image "{c.get("image")}": not found')
            return
        r = self.running.get(key) or _Running(pod["metadata"]["uid"])
        self.running[key] = r
        if not r.dir:
            r.dir = tempfile.mkdtemp(prefix=f"{ns}-{name}-", dir=self.root)
        binds: list[str] = []
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for m in c.get("volumeMounts", []):
            vol = volumes.get(m["name"], {})
            if "secret" not in vol:
                continue
            sname = vol["secret"]["secretName"]
            try:
                secret = self.store.get(SECRETS, ns, sname)
            except ApiError:
                self._waiting(key, "ContainerCreating", f'MountVolume.SetUp failed for volume "{m["name"]}" : '
                              f'secret "{sname}" not found')
                return
            src = os.path.join(r.dir, "volumes", m["name"])
            os.makedirs(src, exist_ok=True)
            mode = int(vol["secret"].get("defaultMode", 0o644))
            data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
            data.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
            for fname, content in data.items():
                path = os.path.join(src, fname)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
                os.chmod(path, mode)
            if not os.path.isdir(m["mountPath"]):
                os.makedirs(m["mountPath"])  # an empty mount point, removed again by stop()
                self.made_dirs.append(m["mountPath"])
            binds += [src, m["mountPath"]]
        if not r.ip:
            r.ip = f"127.{self._net}.{self._next_ip // 250}.{self._next_ip % 250 + 2}"
            self._next_ip += 1
        env = self._env(pod, c, r.ip)
        argv = [_expand(a, env) for a in [*c.get("command", []), *c.get("args", [])]]
        log_path = os.path.join(r.dir, "container.log")
        self.server.log_files[key] = log_path
        with open(log_path, "ab") as out:
            # Own mount and UTS namespaces: the Secret at its mountPath, the pod's own hostname.
            wrapped = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", _MOUNT_SH, "pod",
                       *binds, "--", *argv]
            try:
                r.proc = subprocess.Popen(wrapped, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          env=env, cwd=c.get("workingDir") or r.dir, start_new_session=True)
            except OSError as e:
                self._waiting(key, "CreateContainerError", str(e))
                return

        def running(o: dict) -> None:
            o["status"].update({"phase": "Running", "podIP": r.ip, "podIPs": [{"ip": r.ip}], "hostIP": "127.0.0.1",
                                "startTime": o["status"].get("startTime") or now_iso()})
            o["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                         {"type": "Initialized", "status": "True"},
                                         {"type": "ContainersReady", "status": "False"},
                                         {"type": "Ready", "status": "False"}]
            last = (o["status"].get("containerStatuses") or [{}])[0].get("lastState", {})
            o["status"]["containerStatuses"] = [{"name": c["name"], "ready": False, "restartCount": r.restarts,
                                                 "image": c.get("image"), "started": True, "lastState": last,
                                                 "imageID": f"fake-registry/{c.get('image')}@sha256:0",
                                                 "state": {"running": {"startedAt": now_iso()}}}]
        pod = self.store.update(PODS, *key, running)
        self.store.event(pod, "Started", f"Started container {c['name']}")

    def _env(self, pod: dict, c: dict, ip: str) -> dict:
        env = dict(self.env)
        meta = pod["metadata"]
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = _expand(str(e["value"]), env)
                continue
            ref = (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath", "")
            m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", ref)
            value = {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""),
                     "status.podIP": ip, "metadata.uid": meta["uid"], "spec.nodeName": pod["spec"].get("nodeName", "")
                     }.get(ref, (meta.get("labels") or {}).get(m.group(1), "") if m else "")
            env[e["name"]] = value
        env["HOSTNAME"] = pod["spec"].get("hostname", meta["name"])
        env["MONARCH_FAKE_POD_HOSTNAME"] = env["HOSTNAME"]
        return env

    # -- running -------------------------------------------------------------------------------

    def _watch(self, key, pod: dict, r: _Running) -> None:
        code = r.proc.poll()
        if code is not None:
            # restartPolicy Always: CrashLoopBackOff, then start it again after a growing back-off.
            if r.backoff_until is None:
                r.restarts += 1
                r.backoff_until = time.monotonic() + min(0.5 * 2 ** (r.restarts - 1), 5.0)
                self.store.event(pod, "BackOff", "Back-off restarting failed container worker", "Warning")

                def crashed(o: dict, code=code) -> None:
                    o["status"]["conditions"] = [c if c["type"] not in ("Ready", "ContainersReady")
                                                 else {**c, "status": "False"} for c in o["status"].get("conditions", [])]
                    for cs in o["status"].get("containerStatuses", []):
                        cs.update(ready=False, restartCount=r.restarts,
                                  state={"waiting": {"reason": "CrashLoopBackOff",
                                                     "message": "back-off restarting failed container"}},
                                  lastState={"terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}})
                self.store.update(PODS, *key, crashed)
            if time.monotonic() >= r.backoff_until:
                r.backoff_until = None
                r.proc = None
                self._start(key, pod)
            return
        ready = self._probe(pod, r.ip)

        def upd(o: dict) -> None:
            for cond in o["status"].get("conditions", []):
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond["status"] = "True" if ready else "False"
            for cs in o["status"].get("containerStatuses", []):
                cs["ready"] = ready
                cs["restartCount"] = r.restarts
        self.store.update(PODS, *key, upd)

    def _probe(self, pod: dict, ip: str) -> bool:
        probe = pod["spec"]["containers"][0].get("readinessProbe") or {}
        port = (probe.get("tcpSocket") or {}).get("port")
        if port is None:
            return True
        try:
            with socket.create_connection((ip, int(port)), timeout=0.2):
                return True
        except OSError:
            return False

    # -- stopping ------------------------------------------------------------------------------

    def _terminate(self, key, pod: dict, r: _Running | None) -> None:
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 5))
        if r is not None and r.proc is not None and r.proc.poll() is None:
            if r.killing_since is None:
                r.killing_since = time.monotonic()
                _killpg(r.proc, signal.SIGTERM)
                return
            if time.monotonic() - r.killing_since < grace:
                return
            _killpg(r.proc, signal.SIGKILL)
            r.proc.wait()
        self.running.pop(key, None)
        self.server.log_files.pop(key, None)
        with self.store.lock:
            k = (PODS, key[0], key[1])
            if k in self.store.objects and self.store.objects[k]["metadata"]["uid"] == pod["metadata"]["uid"]:
                self.store.remove(k)

    def _kill_now(self, key, r: _Running) -> None:
        if r.proc is not None and r.proc.poll() is None:
            _killpg(r.proc, signal.SIGKILL)
            r.proc.wait()
        self.running.pop(key, None)


def _expand(s: str, env: dict) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command, args and env values (``$$`` escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
