"""The RDMA-or-TCP choice: made in one place, and it says why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import monarch_rdmafs.rdma as rdma
from monarch_rdmafs.rdma import choose_transport

_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("rdma", sys.argv[1])
mod = importlib.util.module_from_spec(spec); sys.modules["rdma"] = mod; spec.loader.exec_module(mod)
import pyverbs
c = mod.choose_transport()
print(json.dumps({"kind": c.kind, "reason": c.reason, "pyverbs": pyverbs.__file__}))
"""


def _python_with_pyverbs() -> str | None:
    for py in ("/usr/bin/python3", shutil.which("python3") or ""):
        if py and subprocess.run([py, "-c", "import pyverbs.device"], capture_output=True).returncode == 0:
            return py
    return None


def test_with_pyverbs_installed_and_no_device_the_choice_is_tcp_and_says_why():
    py = _python_with_pyverbs()
    if py is None:
        pytest.skip("no Python here has pyverbs (apt-get install python3-pyverbs)")
    r = subprocess.run([py, "-c", _PROBE, rdma.__file__], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "MONARCH_RDMA": ""})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["kind"] == "tcp"
    assert got["reason"].startswith("no RDMA device"), got


def test_without_pyverbs_the_choice_is_tcp_and_says_why(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_pyverbs(name, *a, **k):
        if name.startswith("pyverbs"):
            raise ImportError("No module named 'pyverbs'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pyverbs)
    # No device at all (this machine): nothing to install, so no pyverbs suggestion.
    monkeypatch.setenv("MONARCH_SYS_INFINIBAND", str(tmp_path / "none"))
    c = choose_transport()
    assert (c.kind, c.reason) == ("tcp", "no RDMA device (the kernel lists none in /sys/class/infiniband)")
    # A device the kernel lists, but no pyverbs to use it: then say how to install it.
    (tmp_path / "ib" / "mlx5_0").mkdir(parents=True)
    monkeypatch.setenv("MONARCH_SYS_INFINIBAND", str(tmp_path / "ib"))
    c = choose_transport()
    assert (c.kind, c.reason.startswith("pyverbs is not installed")) == ("tcp", True)


def test_rdma_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("MONARCH_RDMA", "0")
    assert choose_transport().reason == "RDMA turned off (MONARCH_RDMA=0)"
