"""The local scheduler: N hosts on this machine, each its own host-agent process.

Prerequisites: none.  Each host agent is started in its own session so it
outlives ``monarch serve``; it is named ``host<i>`` and logs to
``.monarch/jobs/<name>/logs/host<i>/``.

    $ monarch serve --hosts 2          # two host agents on this machine
    $ monarch run -- hostname
    $ monarch stop
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

from monarch_schedulers.agent_launch import agent_argv, agent_file, project_root
from monarch_schedulers.base import AllocateRequest, Description, HostState, Scheduler

_STOP_GRACE_S = 2.0


class LocalScheduler(Scheduler):
    """Hosts are processes on this machine."""

    name = "local"

    def __init__(self, bind: str = "127.0.0.1"):
        self.bind = bind

    def dryrun(self, spec, job_dir: str) -> AllocateRequest:
        cmds = []
        for i in range(spec.hosts):
            argv = agent_argv(job_dir, extra=self._extra(job_dir, i))
            cmds.append(" ".join(argv))
        return AllocateRequest("local", job_dir, spec.hosts, "\n".join(cmds), payload=spec.hosts)

    def _extra(self, job_dir: str, i: int) -> list[str]:
        return ["--host-rank", str(i), "--hostname", f"host{i}", "--bind", self.bind,
                "--agent-file", agent_file(job_dir, i), "--log-dir", os.path.join(job_dir, "logs", f"host{i}")]

    def allocate(self, request: AllocateRequest) -> str:
        job_dir = request.job_dir
        os.makedirs(os.path.join(job_dir, "agents"), exist_ok=True)
        pids = []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [project_root(), os.environ.get("PYTHONPATH")]))}
        for i in range(request.hosts):
            log_dir = os.path.join(job_dir, "logs", f"host{i}")
            os.makedirs(log_dir, exist_ok=True)
            with open(os.path.join(log_dir, "agent.log"), "ab") as out:
                p = subprocess.Popen(agent_argv(job_dir, extra=self._extra(job_dir, i)), stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                     cwd=os.getcwd())
            pids.append(p.pid)
        job_id = f"local-{uuid.uuid4().hex[:8]}"
        with open(os.path.join(job_dir, "local.json"), "w") as f:
            json.dump({"job_id": job_id, "pids": pids}, f)
        return job_id

    def _pids(self, job_id: str, job_dir: str | None = None) -> list[int]:
        for d in filter(None, [job_dir, *_job_dirs_for(job_id)]):
            try:
                with open(os.path.join(d, "local.json")) as f:
                    data = json.load(f)
                if data.get("job_id") == job_id:
                    return list(data["pids"])
            except (OSError, ValueError):
                continue
        return []

    def describe(self, job_id: str, job_dir: str | None = None) -> Description | None:
        pids = self._pids(job_id, job_dir)
        if not pids:
            return None
        alive = [p for p in pids if _alive(p)]
        if len(alive) == len(pids):
            return Description(job_id, HostState.RUNNING, native_state="running", nodes=[f"host{i}" for i in range(len(pids))])
        if not alive:
            return Description(job_id, HostState.ENDED, reason="every host agent has exited", native_state="exited")
        dead = [f"host{i}" for i, p in enumerate(pids) if p not in alive]
        return Description(job_id, HostState.FAILED, reason=f"host agent(s) {', '.join(dead)} exited", native_state="partial")

    def release(self, job_id: str, job_dir: str | None = None) -> None:
        pids = [p for p in self._pids(job_id, job_dir) if _alive(p)]
        for p in pids:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.02)
        for p in pids:
            if _alive(p):
                _signal(p, signal.SIGKILL)

    def logs(self, job_id: str, host: int | None = None, job_dir: str | None = None) -> str:
        out = []
        for d in filter(None, [job_dir, *_job_dirs_for(job_id)]):
            logs = os.path.join(d, "logs")
            if not os.path.isdir(logs):
                continue
            for name in sorted(os.listdir(logs)):
                if host is not None and name != f"host{host}":
                    continue
                try:
                    with open(os.path.join(logs, name, "agent.log"), errors="replace") as f:
                        out.append(f"== {name} ==\n{f.read()}")
                except OSError:
                    pass
            break
        return "\n".join(out)


def _job_dirs_for(job_id: str) -> list[str]:
    root = os.path.join(os.getcwd(), ".monarch", "jobs")
    try:
        return [os.path.join(root, d) for d in os.listdir(root)]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive: it has exited but nobody reaped it yet.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def create_scheduler(**opts) -> LocalScheduler:
    return LocalScheduler(**opts)
