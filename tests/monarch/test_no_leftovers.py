"""A client that stopped its meshes and shut its context down keeps no thread of ours, and its procs are gone.

Each case is a real client program (a process of its own: its threads are what is counted), with
its own shared host agent, which is stopped at the end (it stays for the next script by design).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from tests.helpers import ROOT, wait_gone

pytestmark = pytest.mark.timeout(180)

PROG = """
import json, os, sys, threading
from monarch.actor import Actor, endpoint, this_host, shutdown_context
from monarch.config import configure

configure(enable_log_forwarding=True)


class Talker(Actor):
    @endpoint
    def talk(self) -> int:
        print("hello from", os.getpid(), flush=True)
        return os.getpid()


procs = this_host().spawn_procs(per_host={"gpus": 2})
procs.logging_option(stream_to_client=True)
pids = list(procs.spawn("talker", Talker).talk.call().get(timeout=60).values())
procs.stop().get(timeout=60)
shutdown_context().get(timeout=60)
# What is left of ours: nothing runs on our behalf once the context is shut down.
left = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
print(json.dumps({"threads": left, "pids": pids}), flush=True)
"""


def test_a_shut_down_client_keeps_no_thread_and_its_procs_are_gone(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "MONARCH_AGENT_IDLE_S": "600", "XDG_RUNTIME_DIR": str(tmp_path)}
    (tmp_path / "prog.py").write_text(PROG)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    agents = [p for p in psutil.process_iter(["cmdline"])
              if p.pid not in before and str(tmp_path) in " ".join(p.info["cmdline"] or [])
              and "--shared-socket" in (p.info["cmdline"] or [])]
    try:
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["threads"] == [], out
        assert len(out["pids"]) == 2 and wait_gone(out["pids"]) == []
        assert r.stdout.count("hello from") == 2, r.stdout
    finally:
        for a in agents:
            try:
                a.terminate()
            except psutil.NoSuchProcess:
                pass
        assert wait_gone([a.pid for a in agents]) == []
