"""The client side of a process: its runtime, and the host it runs on.

The first ``this_host()`` of a script reaches this machine through the user's
shared host agent (``monarch_agents.local_agent``; started if none is warm), or
a private one that exits with the script where that cannot be used; inside an actor, ``this_host()`` is the host
the actor runs on.  A reservation's hosts come from ``monarch.job.job_load()``.
Under ``monarch run script.py`` (``MONARCH_RUN_JOB`` set) this process talks
with the reservation's keys, so both kinds of host can be used together.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import time
from typing import Iterable, TypeVar

from monarch import config as _config
from monarch_agents import runtime as rt_mod
from monarch_agents.messages import HostInfo, Ping, Shutdown
from monarch_agents import client as _agents_client
from monarch_agents import local_agent as _local_agent
from monarch_agents import ports as _ports
from monarch_agents.client import _lock
from monarch_agents.keys import JobKeys
from monarch_agents import actor_logging
from monarch_agents.runtime import Runtime
from monarch_rdmafs.helper import HelperProcess

log = logging.getLogger("monarch.actor")

R = TypeVar("R")

#: Set by ``monarch run script.py``: the state file of the reservation this program runs against.
RUN_JOB_ENV = "MONARCH_RUN_JOB"


def ensure_runtime(keys: JobKeys | None = None, reach: Iterable[str] = (), route: dict | None = None) -> Runtime:
    """This client's runtime, started on first use; under ``monarch run script.py``, with the
    reservation's keys (so its hosts and this machine's can be used together), listening where
    those hosts can reach it (``route``: through the reservation's port-forward, where it has one)."""
    if rt_mod.current() is None:
        if keys is None:
            keys, reach, route = _run_job()
        if ROOT_ENV not in os.environ:  # the root client, not a proc: its records say so, as Monarch's
            actor_logging.install(root_name="<root>")
    return _agents_client.ensure_runtime(keys, reach, route)


def _run_job() -> tuple[JobKeys | None, list[str], dict | None]:
    path = os.environ.get(RUN_JOB_ENV)
    if not path:
        return None, [], None
    from monarch._workbench.state import load_state

    record = load_state(path)
    return record.keys, [h.addr for h in record.hosts], record.route

_local_host: "HostRef | None" = None
_local_proc: HelperProcess | None = None

#: The environment the host agents were started with, as far as this process knows: its
#: own at start (a reservation's agents), or what it gave its private agent.
_env_baseline: dict[str, str] = dict(os.environ)

#: Carries the root client's address to every proc (``get_or_spawn_controller`` reaches it).
ROOT_ENV = "MONARCH_ROOT"

#: Modules worth importing once in the zygote when the client already uses them.
_PRELOADABLE = ("torch", "numpy")


class HostRef:
    """A reserved host: its agent's address, name and rank (picklable)."""

    __slots__ = ("addr", "host", "host_rank")

    def __init__(self, addr: str, host: str, host_rank: int):
        self.addr = addr
        self.host = host
        self.host_rank = host_rank

    def __reduce__(self):
        return HostRef, (self.addr, self.host, self.host_rank)

    def __repr__(self) -> str:
        return f"HostRef({self.host!r}, {self.addr!r})"


def local_host() -> HostRef:
    """The host agent of this client on this machine, found or started on first use: the user's
    shared agent (``monarch_agents.local_agent``) where it may be used, else a private one."""
    global _local_host, _local_proc
    with _lock:
        if _local_host is not None:
            return _local_host
        # This API for every proc; torch and numpy where this program already paid for them.
        preload = ["monarch.actor", *(m for m in _PRELOADABLE if m in sys.modules)]
        hostname = os.environ.get("MONARCH_HOSTNAME") or socket.gethostname()
        ready_s = _config.seconds("host_spawn_ready_timeout")  # a bad value fails here, before any start
        log_dir = os.path.join(os.path.expanduser("~"), ".monarch", "logs", "local")
        if rt_mod.current() is None and not os.environ.get(RUN_JOB_ENV):
            shared = _local_agent.connect(preload, _agents_client.bind_address(), hostname, log_dir, _pythonpath(),
                                          start_timeout=ready_s)
            if shared is not None:
                try:
                    return _use_shared(shared)
                except (OSError, RuntimeError) as e:  # e.g. no stdout to hand over: an agent of our own
                    shared.sock.close()
                    print(f"monarch: not using the shared host agent ({e}); starting one for this script",
                          file=sys.stderr)
        rt = ensure_runtime()
        cmd = [sys.executable, "-m", "monarch_agents.host_agent", "--ephemeral", "--inherit-stdio", "--fork-zygote",
               "--lifeline-fd", "0",
               "--hostname", hostname, "--bind", rt.mailbox.bind_host, "--preload", ",".join(preload),
               "--log-dir", log_dir]
        global _env_baseline
        _env_baseline = dict(os.environ)
        # Its address comes on a pipe of its own (--info-fd): its stdout is the user's terminal.
        proc = HelperProcess(cmd, env={**os.environ, "PYTHONPATH": _pythonpath()}, ready_fd_flag="--info-fd")
        # Its stdin stays open for as long as we live: the agent stops when it closes (--lifeline-fd 0),
        # however we end (kill -9 too), even before the Ping below makes it watch us as its owner.
        proc.start((json.dumps(rt.keys.as_dict()) + "\n").encode(), keep_stdin=True)
        info = _read_info(proc, ready_s)
        _local_proc = proc
        _local_host = HostRef(info["addr"], info["host"], 0)
        # The agent learns its owner from this ping, and exits when we go away.
        rt.request(info["addr"], lambda port: Ping(port)).get(timeout=ready_s)
        atexit.register(_stop_local_host)
        return _local_host


_shared: "_local_agent.SharedAgent | None" = None


def _use_shared(shared: "_local_agent.SharedAgent") -> HostRef:
    """Talk to the shared agent with its keys, and own our procs there (called under ``_lock``)."""
    global _local_host, _shared, _env_baseline
    rt = ensure_runtime(JobKeys(**shared.keys))
    shared.join(rt.addr, os.getcwd())
    # Procs get the agent's environment plus what differs in ours (see env_changes), so they see
    # ours; PYTHONPATH stays the agent's where we have none (it is how procs find this package).
    _env_baseline = dict(shared.env)
    if "PYTHONPATH" not in os.environ:
        _env_baseline.pop("PYTHONPATH", None)
    _shared = shared
    _local_host = HostRef(shared.addr, shared.host, 0)
    atexit.register(_stop_local_host)
    return _local_host


def shared_agent_addr() -> str | None:
    """The address of the user's shared host agent if this client uses it, else None."""
    host = _local_host
    return host.addr if _shared is not None and host is not None else None


def refresh_local_stdio(rt: Runtime) -> None:
    """Before procs start on the shared agent: if this program redirected its stdout or stderr since
    it last handed them over, hand them over again, so those procs write where it writes now (as
    Monarch's local procs do: they get the stdout of their host, this process, when they start)."""
    shared = _shared
    if shared is not None and shared.stdio_moved():
        try:
            shared.join(rt.addr, os.getcwd())
        except (OSError, RuntimeError) as e:
            log.warning("could not hand the shared host agent this program's new stdout/stderr: %s", e)


#: Carries :func:`user_sys_path` to new procs (see ``monarch_agents.proc_agent.main``).
SYS_PATH_ENV = "MONARCH_SYS_PATH"


def env_changes() -> tuple[dict[str, str], list[str]]:
    """What this process changed in ``os.environ`` since its host agents started: (set, unset).

    New procs get these on top of their agent's environment, so they see ours as it is now.
    Monarch's own variables are left out: the spawner sets those for each proc.
    """
    env = os.environ
    changed = {k: v for k, v in env.items() if _env_baseline.get(k) != v and not k.startswith("MONARCH_")}
    unset = [k for k in _env_baseline if k not in env and not k.startswith("MONARCH_")]
    return changed, unset


def user_sys_path() -> list[str]:
    """This process's sys.path entries that a fresh interpreter would not have.

    That is the script's directory, PYTHONPATH, and what the program added;
    not the standard library or site-packages (a remote proc has its own).
    """
    prefixes = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    out = []
    for p in sys.path:
        p = os.path.abspath(p or os.getcwd())  # "" is the current directory
        if any(p == x or p.startswith(x + os.sep) for x in prefixes) or not os.path.isdir(p):
            continue
        out.append(p)
    return list(dict.fromkeys(out))


def _pythonpath() -> str:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


def _read_info(proc: HelperProcess, ready_s: float) -> dict:
    line = proc.wait_ready(ready_s)
    if not line:
        still_starting = not proc.eof
        code = proc.stop(time.monotonic() + (0.0 if still_starting else 5.0))  # an exiting one: its code
        if still_starting:
            raise RuntimeError(f"the local host agent did not start within {ready_s:g} s "
                               "(monarch.config host_spawn_ready_timeout)")
        raise RuntimeError(f"the local host agent exited during startup (exit code {code})")
    return json.loads(line)


def _stop_local_host() -> None:
    global _local_host, _local_proc, _shared
    host, proc, shared = _local_host, _local_proc, _shared
    _local_host = _local_proc = _shared = None
    if shared is not None:
        rt = rt_mod.current()
        if rt is not None:
            rt.stopping = True  # procs dying now are expected, not failures
        shared.leave()  # the agent stops what we own there; it stays for the next script
        return
    if host is None or proc is None:
        return
    rt = rt_mod.current()
    try:
        if rt is not None:
            rt.stopping = True  # procs dying now are expected, not failures
            rt.request(host.addr, lambda port: Shutdown(port)).get(timeout=2)
    except Exception as e:
        # The local host agent did not answer its shutdown: the kill below ends it anyway.
        log.debug("local host agent shutdown request: %s", e)
    proc.stop(time.monotonic() + 3.0)


def host_info(host: HostRef, timeout: float = 5.0) -> HostInfo:
    return ensure_runtime().request(host.addr, lambda port: Ping(port)).get(timeout=timeout)


class Channel(_ports.Channel[R]):
    """Factory for port / receiver pairs (opening one starts this client's runtime if need be)."""

    @staticmethod
    def open(once: bool = False) -> tuple[_ports.Port[R], _ports.PortReceiver[R]]:
        ensure_runtime()
        return _ports.Channel.open(once)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[_ports.Port[R], _ports.RankedPortReceiver]:
        ensure_runtime()
        return _ports.Channel.open_ranked(once)
