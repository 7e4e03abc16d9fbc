"""The local scheduler: N hosts on this machine, each its own host-agent process.

Prerequisites: none.  Each host agent is started in its own session so it
outlives ``monarch serve``; ``JobSpec.options["env"]`` adds to its environment (``ProcessJob(env=)``); it is named ``host<i>`` and logs to
``.monarch/jobs/<name>/logs/host<i>/``.

    $ monarch serve --hosts 2          # two host agents on this machine
    $ monarch run -- hostname
    $ monarch stop

With ``netns=True`` (``monarch serve --netns``, root only) each host agent, and
everything it starts, runs in its own network namespace with its own address
on a private bridge (``monarch_schedulers/netns.py``): messages between hosts then
take the TCP/CURVE path of a real cluster.  ``stop`` removes the namespaces.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from monarch_agents.files import private_dir, write_atomic
from monarch_agents.names import open_private
from monarch_schedulers.agent_launch import agent_argv, agent_file, project_root
from monarch_schedulers.base import AllocateRequest, Description, HostState, JobSpec, Scheduler
from monarch_schedulers.processes import OwnedProcess

if TYPE_CHECKING:
    from monarch_schedulers import netns

log = logging.getLogger("monarch.scheduler.local")

_STOP_GRACE_S = 2.0


class LocalScheduler(Scheduler):
    """Hosts are processes on this machine.

    ``netns``, ``subprocess`` and ``uuid`` are imported where a reservation is made or ended: every
    ``monarch run`` asks :meth:`describe`, which needs none of them (~4 ms of its start).
    """

    name = "local"
    #: The longest the warm launcher may take to fork every host agent (``monarch serve`` sets it from
    #: its ``serve_agent_start_max_idle``): a launcher stuck in an import must not hang serve.
    start_timeout_s: float = 300.0

    def __init__(self, bind: str = "127.0.0.1", netns: bool = False):
        self.bind = bind
        self.netns = netns

    def dryrun(self, spec: JobSpec, job_dir: str) -> AllocateRequest:
        import uuid

        from monarch_schedulers import netns

        tag = uuid.uuid4().hex[:8]
        cmds = []
        if self.netns:
            p = netns.plan(tag, spec.hosts, subnet="10.213.0.0/24")
            cmds.append(f"# bridge {p.bridge} at the first free /24 of {netns.SUPERNET} (shown as 10.213.0.0/24);"
                        f" host i in netns monarch-{tag}-h<i>")
        for i in range(spec.hosts):
            argv = agent_argv(job_dir, preload=self.agent_preload, keys_on_stdin=self.keys is not None,
                              extra=self._extra(job_dir, i, p.hosts[i].ip if self.netns else self.bind))
            if self.netns:
                argv = netns.enter_argv(p.hosts[i], argv, f"host{i}", os.path.join(job_dir, "hosts"))
            cmds.append(" ".join(argv))
        env = dict((spec.options or {}).get("env") or {})
        if env:
            cmds.insert(0, "env: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
        return AllocateRequest("local", job_dir, spec.hosts, "\n".join(cmds),
                               payload={"env": env, "hosts": spec.hosts, "tag": tag})

    def _extra(self, job_dir: str, i: int, bind: str) -> list[str]:
        # Every peer of a local host's agent is a process of this machine and this user: it listens on
        # its Unix socket only, so other users of the machine have no port of it to reach (--netns
        # hosts have stacks of their own: TCP there).
        unix = [] if self.netns else ["--unix-only"]
        return ["--host-rank", str(i), "--hostname", f"host{i}", "--bind", bind, *unix,
                "--agent-file", agent_file(job_dir, i), "--log-dir", os.path.join(job_dir, "logs", f"host{i}")]

    def allocate(self, request: AllocateRequest) -> str:
        import uuid

        from monarch_schedulers import netns

        job_dir = request.job_dir
        tag = (request.payload.get("tag") if isinstance(request.payload, dict) else None) or uuid.uuid4().hex[:8]
        job_id = f"local-{tag}"
        private_dir(os.path.join(job_dir, "agents"), top=job_dir)
        plan = self._make_namespaces(tag, request.hosts) if self.netns else None
        procs: list[OwnedProcess] = []
        try:
            if plan is not None:
                _write_private(os.path.join(job_dir, "hosts"), netns.hosts_file(plan, [f"host{i}" for i in range(request.hosts)]))
            extra_env = request.payload.get("env") or {} if isinstance(request.payload, dict) else {}
            env = {**os.environ, **extra_env,
                   "PYTHONPATH": os.pathsep.join(filter(None, [project_root(), os.environ.get("PYTHONPATH")]))}
            for i in range(request.hosts):
                private_dir(os.path.join(job_dir, "logs", f"host{i}"), top=job_dir)
            procs.extend(self._fork_agents(job_dir, request.hosts, env, plan))
            record = {"job_id": job_id, "agents": [dataclasses.asdict(a) for a in procs]}
            if plan is not None:
                record["netns"] = plan.to_json()
            _write_private(os.path.join(job_dir, "local.json"), json.dumps(record))
        except BaseException:
            for a in procs:
                a.signal(signal.SIGKILL)
            if plan is not None:
                netns.remove(plan)
            raise
        return job_id

    def _fork_agents(self, job_dir: str, hosts: int, env: dict, plan: "netns.NetnsPlan | None" = None) -> list[OwnedProcess]:
        """Start ``hosts`` host agents as forks of one warm launcher (``host_agent --fork-hosts``):
        one interpreter's start and imports for the whole reservation instead of two per host,
        and the pages they fill shared by every agent and zygote (256 hosts fit on one machine).
        With ``plan`` (``--netns``) each fork enters its host's namespaces first: 64 such hosts took
        9 s and 1.9 GB as two interpreters each."""
        import subprocess

        from monarch_schedulers.errors import SchedulerError

        spec = []
        for i in range(hosts):
            h = {"args": self._extra(job_dir, i, plan.hosts[i].ip if plan is not None else self.bind),
                 "log": os.path.join(job_dir, "logs", f"host{i}", "agent.log")}
            if plan is not None:
                h.update(netns=plan.hosts[i].path, hostname=f"host{i}", hosts_file=os.path.join(job_dir, "hosts"))
            spec.append(h)
        spec_file = os.path.join(job_dir, "fork-hosts.json")
        _write_private(spec_file, json.dumps(spec))
        argv = [*agent_argv(job_dir, preload=self.agent_preload, keys_on_stdin=self.keys is not None),
                "--fork-hosts", spec_file]
        # The launcher reads the keys from its stdin (a pipe) once it has forked every agent, and hands
        # each agent its copy over a pipe of its own (host_agent.fork_hosts).
        keys = (json.dumps(self.keys.as_dict()) + "\n").encode() if self.keys is not None else b""
        with open_private(os.path.join(job_dir, "logs", "launcher.log"), "ab") as log:
            try:
                p = subprocess.run(argv, input=keys, stdout=subprocess.PIPE, stderr=log, env=env,
                                   cwd=os.getcwd(), start_new_session=True, timeout=self.start_timeout_s)
            except subprocess.TimeoutExpired:
                # Killed; the agents it forked already (each in a session of its own) bear its command line.
                _kill_by_argument(spec_file)
                raise SchedulerError(f"hosts not ready after {self.start_timeout_s:g} s: the local host agents' "
                                     "launcher did not finish (it was stopped)",
                                     f"see {os.path.join(job_dir, 'logs', 'launcher.log')}; "
                                     "serve --timeout or MONARCH_SERVE_STALL_TIMEOUT waits longer") from None
        try:
            pids = [int(x) for x in json.loads(p.stdout.decode().strip().splitlines()[-1])["pids"]]
        except (ValueError, KeyError, IndexError, TypeError):
            pids = []
        if p.returncode != 0 or len(pids) != hosts:
            try:
                with open(os.path.join(job_dir, "logs", "launcher.log"), errors="replace") as f:
                    tail = " | ".join(f.read().strip().splitlines()[-3:])
            except OSError:
                tail = ""
            raise SchedulerError(f"the local host agents did not start (exit {p.returncode})" + (f": {tail}" if tail else ""),
                                 f"see {os.path.join(job_dir, 'logs', 'launcher.log')}")
        owned, gone = [], []
        for pid in pids:
            try:
                owned.append(OwnedProcess.of(pid))
            except Exception:  # psutil: it exited already (a bad argument, no memory)
                gone.append(pid)
        if gone:
            for a in owned:
                a.signal(signal.SIGKILL)
            raise SchedulerError(f"{len(gone)} of {hosts} local host agents exited as they started",
                                 f"see {os.path.join(job_dir, 'logs', 'host<i>', 'agent.log')}")
        return owned

    def _make_namespaces(self, tag: str, hosts: int) -> "netns.NetnsPlan":
        from monarch_schedulers import netns
        from monarch_schedulers.errors import SchedulerError

        try:
            return netns.create(tag, hosts)
        except netns.NetnsError as e:
            raise SchedulerError(f"--netns: {e.message}", e.hint or "`monarch serve` without --netns") from None

    def namespaces(self, job_id: str, job_dir: str | None = None) -> "netns.NetnsPlan | None":
        """The network namespaces of a ``--netns`` reservation (None for plain local hosts)."""
        from monarch_schedulers import netns

        data = self._record(job_id, job_dir)
        return netns.NetnsPlan.from_json(data["netns"]) if data and data.get("netns") else None

    def _record(self, job_id: str, job_dir: str | None = None) -> dict | None:
        found = self._found(job_id, job_dir)
        return found[1] if found else None

    def _job_dir(self, job_id: str, job_dir: str | None = None) -> str | None:
        found = self._found(job_id, job_dir)
        return found[0] if found else None

    def _found(self, job_id: str, job_dir: str | None) -> tuple[str, dict] | None:
        """(job folder, its local.json) of ``job_id``."""
        for d in filter(None, [job_dir, *_job_dirs_for(job_id)]):
            try:
                with open(os.path.join(d, "local.json")) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("job_id") == job_id:
                return d, data
        return None

    def _agents(self, job_id: str, job_dir: str | None = None) -> list[OwnedProcess]:
        data = self._record(job_id, job_dir)
        try:
            return [OwnedProcess(int(a["pid"]), float(a["started"])) for a in data["agents"]] if data else []
        except (KeyError, TypeError, ValueError):
            return []

    def describe(self, job_id: str, job_dir: str | None = None) -> Description | None:
        agents = self._agents(job_id, job_dir)
        if not agents:
            return None
        if (self._record(job_id, job_dir) or {}).get("released"):
            return Description(job_id, HostState.ENDED, reason="the reservation was released (`monarch stop`)",
                               native_state="released")
        alive = [a.alive() for a in agents]
        if all(alive):
            return Description(job_id, HostState.RUNNING, native_state="running", nodes=[f"host{i}" for i in range(len(agents))])
        if not any(alive):
            return Description(job_id, HostState.ENDED, reason="every host agent has exited", native_state="exited")
        dead = [f"host{i}" for i, up in enumerate(alive) if not up]
        return Description(job_id, HostState.FAILED, reason=f"host agent(s) {', '.join(dead)} exited", native_state="partial")

    def release(self, job_id: str, job_dir: str | None = None) -> None:
        from monarch_schedulers import netns

        found = self._found(job_id, job_dir)
        if found is not None and not found[1].get("released"):
            # Before any agent is signalled: a run whose ranks die of this asks `describe` why, and
            # must hear that the reservation was released, not that some host's agent exited.
            try:
                _write_private(os.path.join(found[0], "local.json"), json.dumps({**found[1], "released": True}))
            except OSError as e:
                # A full disk must not keep the hosts: they are stopped all the same (a run they end
                # then reads "agent exited" instead of "released").
                log.warning("could not note the release in %s: %s", found[0], e)
        agents = [a for a in self._agents(job_id, job_dir) if a.alive()]
        for a in agents:
            a.signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        while time.monotonic() < deadline and any(a.alive() for a in agents):
            time.sleep(0.02)
        for a in agents:
            a.signal(signal.SIGKILL)
        plan = self.namespaces(job_id, job_dir)
        try:
            # An agent stopped in order removed its workspace store; one killed earlier (-9, OOM) could not.
            found = self._job_dir(job_id, job_dir)
            if found is not None:
                from monarch_rdmafs.location import remove_workspace  # rdmafs: only on stop

                # At once: a killed agent leaves its mount to unmount (a fusermount each), and 256
                # of them one after the other took ~30 s on a loaded 2-core machine.
                logs = [os.path.join(found, "logs", f"host{i}") for i in range(len(self._agents(job_id, found)))]
                _each_at_once(remove_workspace, logs, 16)
        finally:
            # Whatever that cleanup met (a broken install, a busy mount), the namespaces and the
            # bridge go: nothing else removes them.
            if plan is not None:
                netns.remove(plan)

    def logs(self, job_id: str, host: int | None = None, job_dir: str | None = None) -> str:
        out = []
        for d in filter(None, [job_dir, *_job_dirs_for(job_id)]):
            logs = os.path.join(d, "logs")
            if not os.path.isdir(logs):
                continue
            for name in sorted(os.listdir(logs)):
                if host is not None and name != f"host{host}":
                    continue
                text = ""
                # A capped agent.log's lines before its last rotation are in agent.log.1 (monarch_agents.logcap).
                for part in ("agent.log.1", "agent.log"):
                    try:
                        with open(os.path.join(logs, name, part), errors="replace") as f:
                            text += f.read()
                    except OSError:
                        if part == "agent.log":
                            text = None
                if text is not None:
                    out.append(f"== {name} ==\n{text}")
            break
        return "\n".join(out)


def _write_private(path: str, text: str) -> None:
    """Write ``path`` whole or not at all, mode 0600."""
    write_atomic(path, text.encode())


def _job_dirs_for(job_id: str) -> list[str]:
    root = os.path.join(os.getcwd(), ".monarch", "jobs")
    try:
        return [os.path.join(root, d) for d in os.listdir(root)]
    except OSError:
        return []


def create_scheduler(**opts) -> LocalScheduler:
    return LocalScheduler(**opts)


def _kill_by_argument(arg: str) -> None:
    """SIGKILL this user's processes whose command line holds ``arg`` (a file only this job has)."""
    import psutil

    me = os.getuid()
    for p in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            if p.info["uids"] and p.info["uids"].real == me and arg in (p.info["cmdline"] or []):
                p.kill()
        except psutil.Error:
            continue


def _each_at_once(fn: Callable[[str], Any], items: list[str], width: int) -> None:
    """``fn(item)`` for every item, ``width`` at a time, on plain threads: a release also runs at
    interpreter exit (a job applied with ``cached_path=None``), when a ThreadPoolExecutor refuses
    new work ("cannot schedule new futures after interpreter shutdown") and the mounts would stay."""
    todo = list(items)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                item = todo.pop()
            try:
                fn(item)
            except BaseException as e:  # noqa: BLE001 - raised below, in the caller
                errors.append(e)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(width, max(1, len(items))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
