"""A FAKE Kubernetes cluster on this machine: API server, control plane and one kubelet.

    cluster = FakeCluster(tmpdir, images=["monarch:test"]).start()
    # cluster.kubeconfig is a real kubeconfig: the kubernetes client and kubectl use it
    cluster.stop()

Run as ``python -m tests.fakes.kube.cluster --kubeconfig PATH [--crd]`` to keep one up by hand.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import threading

import yaml

from tests.fakes.kube.apiserver import FakeApiServer
from tests.fakes.kube.controllers import Controllers
from tests.fakes.kube.kubelet import Kubelet


class FakeCluster:
    def __init__(self, workdir: str, images: list[str], crd_installed: bool = False, env: dict | None = None,
                 host: str = "127.0.0.1"):
        self.token = secrets.token_hex(16)
        self.cert, self.key = _self_signed(workdir, host)
        self.server = FakeApiServer(self.token, crd_installed=crd_installed, tls=(self.cert, self.key), host=host)
        self.controllers = Controllers(self.server)
        self.kubelet = Kubelet(self.server, images, env=env)
        self.kubeconfig = os.path.join(workdir, "kubeconfig")
        self.context = "fake"

    def start(self) -> "FakeCluster":
        self.server.start()
        self.controllers.start()
        self.kubelet.start()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": self.context,
            "clusters": [{"name": "fake", "cluster": {"server": self.server.url, "certificate-authority": self.cert}}],
            "users": [{"name": "tester", "user": {"token": self.token}}],
            "contexts": [{"name": self.context, "context": {"cluster": "fake", "user": "tester", "namespace": "default"}}],
        }
        fd = os.open(self.kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(config, f)
        return self

    def stop(self) -> None:
        self.kubelet.stop()
        self.controllers.stop()
        self.server.stop()


def _self_signed(workdir: str, host: str) -> tuple[str, str]:
    """A certificate for ``host`` that the kubeconfig trusts (kubectl sends tokens only over TLS)."""
    cert, key = os.path.join(workdir, "apiserver.crt"), os.path.join(workdir, "apiserver.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=fake-kube",
                    "-addext", f"subjectAltName=IP:{host}", "-addext", "basicConstraints=critical,CA:TRUE",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return cert, key


def main() -> None:
    p = argparse.ArgumentParser(description="a FAKE Kubernetes cluster for trying monarch's kubernetes scheduler")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--crd", action="store_true", help="install the MonarchMesh custom resource")
    p.add_argument("--image", action="append", default=["monarch:latest"])
    a = p.parse_args()
    c = FakeCluster(os.path.dirname(os.path.abspath(a.kubeconfig)), a.image, crd_installed=a.crd)
    c.kubeconfig = a.kubeconfig
    c.start()
    print(f"fake cluster at {c.server.url}; KUBECONFIG={a.kubeconfig}; Ctrl-C stops it", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    c.stop()


if __name__ == "__main__":
    main()
