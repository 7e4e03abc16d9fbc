"""Helpers shared by the test suite (imported once, as ``tests.helpers``).

Every process a test starts inherits ``MONARCH_TEST_SESSION`` (set below, in
this process's environment, before anything is started), so processes left
behind by *this* test session can be told apart from those of another session
running on the same machine.  At the end of the session, none may be left:
no host agent, no zygote, no proc, no test script.
"""

from __future__ import annotations

import json
import queue
import os
import subprocess
import sys
import time
import uuid

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "MONARCH_TEST_SESSION"
SESSION = uuid.uuid4().hex
os.environ[MARK] = SESSION
# Procs and scripts find the repo (and the tests package, for tests.monarch.actors).
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys([ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]))

# A test's reservation is looked up from its own tmp dir upwards: never let it find one served
# in the temp folder itself by someone else.
os.environ["MONARCH_CEILING_DIRECTORIES"] = os.path.realpath(__import__("tempfile").gettempdir())

# Scripts start a private host agent each, which exits with them: a shared one (see
# monarch_agents.local_agent) would outlive the test that started it.  Its own tests turn it on.
os.environ["MONARCH_SHARED_AGENT"] = "0"
# `monarch run` would start a warm runner (monarch_cli/warm.py) that outlives the test too; its own tests turn it on.
os.environ["MONARCH_WARM_RUN"] = "0"

DEFAULT_DEADLINE_S = 5.0


# -- processes ------------------------------------------------------------------


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, deadline_s: float = DEFAULT_DEADLINE_S) -> list[int]:
    """Poll until every pid is gone or the deadline passes; returns those still alive."""
    pids = list(pids)
    end = time.monotonic() + deadline_s
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.02)


def session_pids() -> dict[int, str]:
    """pid -> command line of every live process started (directly or not) by this test session."""
    me = os.getpid()
    found = {}
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(MARK) == SESSION:
                found[p.pid] = " ".join(p.cmdline())
        except (psutil.Error, OSError):
            continue
    return found


def wait_no_new_pids(before: set[int], deadline_s: float = DEFAULT_DEADLINE_S) -> dict[int, str]:
    end = time.monotonic() + deadline_s
    while True:
        new = {p: c for p, c in session_pids().items() if p not in before}
        if not new or time.monotonic() >= end:
            return new
        time.sleep(0.05)


def kill_tree(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


# -- the client runtime of this test process --------------------------------------


def start_client():
    """This process's monarch runtime and its private host agent (started once)."""
    from monarch_agents.client import ensure_runtime
    from monarch.actor._client import local_host

    rt = ensure_runtime()
    local_host()
    return rt


def stop_client() -> None:
    """Stop the private host agent and close this process's runtime, so the next package starts clean."""
    from monarch_agents.client import close_runtime
    from monarch.actor import _client

    _client._stop_local_host()
    close_runtime()


# -- a dedicated host agent (one a test may kill) -------------------------------


class HostAgentProc:
    """A host agent started by a test, with this process's job keys."""

    def __init__(self, proc: subprocess.Popen, info: dict, log_path: str):
        self.proc = proc
        self.info = info
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def addr(self) -> str:
        return self.info["addr"]

    def host_mesh(self):
        from monarch.actor import HostMesh
        from monarch.actor._client import HostRef

        return HostMesh([HostRef(self.addr, self.info["host"], 0)])

    def children(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_host_agent(keys, tmp_path, hostname: str = "testhost", extra: list[str] | None = None,
                     module: str = "monarch_agents.host_agent") -> HostAgentProc:
    """A host agent (``python -m module``) with this process's keys, logging into ``tmp_path``."""
    log_path = os.path.join(str(tmp_path), f"{hostname}-agent.log")
    r, w = os.pipe()
    cmd = [sys.executable, "-m", module, "--hostname", hostname, "--bind", "127.0.0.1",
           "--info-fd", str(w), "--log-dir", os.path.join(str(tmp_path), "logs"), "--preload", "monarch.actor",
           *(extra or [])]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(w,), cwd=ROOT)
    os.close(w)
    keys_json = json.dumps(keys.as_dict())
    proc.stdin.write((keys_json + "\n").encode())
    proc.stdin.close()
    with os.fdopen(r, "rb") as f:
        line = f.readline()  # the agent writes one JSON line once it listens
    if not line:
        proc.wait(timeout=10)
        with open(log_path) as f:
            raise RuntimeError(f"host agent failed to start:\n{f.read()}")
    return HostAgentProc(proc, json.loads(line), log_path)


# -- scripts ---------------------------------------------------------------------


def run_script(path, *args, timeout: float = 60, cwd=None) -> subprocess.CompletedProcess:
    """Run ``python path`` as a user would; the result has text stdout/stderr."""
    return subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT)


class StreamInbox:
    """One stream port of a test client (runs' RunOutput/RunExited, debug sessions' messages)."""

    def __init__(self, rt, timeout: float = 30.0):
        self.q: queue.Queue = queue.Queue()
        self.port = rt.open_stream(self.q.put)
        self.timeout = timeout

    def next(self, kind: type, timeout: float | None = None):
        """The next message of ``kind`` (others are skipped)."""
        while True:
            msg = self.q.get(timeout=self.timeout if timeout is None else timeout)
            if isinstance(msg, kind):
                return msg
