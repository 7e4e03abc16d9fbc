"""The host agent: one long-lived process per reserved host.

It owns what every capability shares: the runtime (its address), the warm
zygote that forks children, the children themselves, and their owners (when an
owner's connection drops, every child it owned is killed: nothing outlives its
owner).  Everything it does for clients is a service (``monarch_agents.services``):
procs, runs and shells today, each in its own module, listed in :data:`SERVICES`.

Run as ``python -m monarch_agents.host_agent``; it reads the job's keys as JSON on
stdin (never from the command line, where ``ps`` would show them) and writes
its address, atomically, to ``--agent-file``.  ``Shutdown``, SIGTERM or the
zygote's death stop it in order: each service (last listed first) stops its
children against one deadline, then the zygote, then the sockets, and the
process exits normally.

What it does not do: restart procs, or reserve hosts (schedulers do that).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterable, TypeVar

from monarch_agents import messages as m
from monarch_agents.files import private_dir, write_atomic
from monarch_agents.hardening import not_dumpable
from monarch_agents.keys import CLIENT, LOCAL_PROC
from monarch_agents.logcap import LogPump, StdioLogCap, log_cap
from monarch_agents.runtime import Runtime, install
from monarch_agents.services import (Child, SerialWorker, Service, debug, fanout, killpg, procs, relay, runs, shells,
                                     telemetry, workspace)
from monarch_agents.transport import JobKeys, route_ip
from monarch_agents.zygote import ALWAYS_PRELOAD, ZygoteClient

S = TypeVar("S", bound=Service)
log = logging.getLogger("monarch.host_agent")

#: The agent's services, in start order; they stop in the reverse order.  A new capability is a
#: module in monarch_agents/services/ and one line here (see ``monarch_agents.services``).
SERVICES: tuple[type[Service], ...] = (
    telemetry.TelemetryService,  # first, so it stops last: rows recorded while the others stop are kept
    workspace.WorkspaceAgentService,  # before runs, so it stops after them: runs leave its mount before it unmounts
    debug.DebugService,  # stops after the ranks whose sessions it relays
    procs.ProcsService,
    runs.RunsService,
    shells.ShellsService,
    relay.RelayService,  # listens only where --relay-port is given (a client behind a port-forward)
    fanout.FanoutService,  # control messages to many hosts through a tree of agents
)

#: What any member of the job may send a host agent (procs announce themselves; a reply only
#: resolves a port the agent opened).
_FROM_ANY_MEMBER = frozenset({m.Ping, m.ProcReady, m.Reply})

#: How long an ordered stop may take, all services together (each gives its children ~1 s after SIGTERM).
_STOP_DEADLINE_S = 5.0
#: How long a stop waits at least for its last answers to leave (see ``HostAgent.stop``).
_ANSWERS_LINGER_S = 5.0
#: How long the zygote gets to exit after SIGTERM.
_ZYGOTE_STOP_S = 1.0
#: How long a proc whose owner died may take to exit after SIGTERM before it is killed.
_REAP_GRACE_S = 1.0
#: How long the procs' log pump may take at least, after the services' stop, to append the files' tails.
_PROC_LOGS_STOP_S = 1.0
#: How long the shared agent's owner listener may take to wake and join its threads at exit.
_LISTENER_STOP_S = 2.0


class HostAgent:
    """One host's agent: its runtime, its zygote, its children, and the services that use them.

    What a service may use: ``keys``, ``host``, ``host_rank``, ``log_dir``, ``rt``,
    ``stopping``; :meth:`send`, :meth:`reply`, :meth:`track_owner`, :meth:`child_env`, :meth:`place_child`,
    :meth:`stdio_for`, :meth:`start_child`, :meth:`wait_exited`.
    """

    def __init__(self, keys: JobKeys, *, host: str, host_rank: int, bind_host: str, log_dir: str,
                 ephemeral: bool, preload: list[str], inherit_stdio: bool,
                 services: Iterable[type[Service]] = SERVICES, port: int = 0, relay_port: int = 0,
                 fork_zygote: bool = False, zygote: ZygoteClient | None = None, unix_only: bool = False):
        """``fork_zygote``: the zygote is a fork of this process (its ``preload`` is imported already:
        an agent forked by ``--fork-hosts``) instead of a new interpreter.  ``zygote``: one started
        already (:func:`main` starts it before it reads the keys)."""
        # The zygote first, while this process has one thread (the runtime's context starts more).
        self.zygote = zygote or (ZygoteClient.fork(preload) if fork_zygote else ZygoteClient.start(preload))
        self.keys = keys
        #: Where the relay service stands in for a client outside the cluster (0: no relay).
        self.relay_port = relay_port
        self.host = host
        self.host_rank = host_rank
        self.log_dir = log_dir
        self.ephemeral = ephemeral
        self.inherit_stdio = inherit_stdio
        self.rt = install(Runtime(keys, bind_host=bind_host, name=f"host-agent[{host}]", host=host,
                                     bind_port=port, host_agent=True, admit=self._admit, tcp=not unix_only))
        self.started_at = time.time()
        self.lock = threading.RLock()
        self.exits = threading.Condition(self.lock)  # notified whenever a child exits
        self.pending: dict[int, Child] = {}  # zygote request id -> child, until "spawned" (or "error")
        self.children: dict[int, Child] = {}  # pid -> child, until it exits
        self.owners: set[str] = set()
        #: Owners watched through the agent that forwarded their commands (a fan-out's parent): its address -> them.
        self._via_owners: dict[str, set[str]] = {}
        #: A shared agent's owners (``monarch_agents.local_agent``): their stdout/stderr and cwd, for their procs.
        self.owner_places: dict[str, tuple[list[int], str]] = {}
        #: Set once a stop was asked for (Shutdown, SIGTERM, the zygote's death, an ephemeral agent's
        #: last owner leaving); :meth:`run_until_stopped` then stops everything in order.
        self.stopping = threading.Event()
        self.stopped = threading.Event()
        self._base_env = dict(os.environ)
        self._base_env["MONARCH_HOSTNAME"] = host
        private_dir(log_dir)
        self.services: list[Service] = [cls(self) for cls in services]
        self._from_local_procs = frozenset().union(*(type(s).from_local_procs for s in self.services))
        self._workers: list[SerialWorker] = []
        #: Reads procs' output into their capped log files (made at the first proc that logs to a file).
        self._proc_logs: LogPump | None = None

    def service(self, kind: type[S]) -> S | None:
        """This agent's service of type ``kind``, or None when it is not listed: how services find
        each other (never by writing into one another)."""
        for s in self.services:
            if isinstance(s, kind):
                return s
        return None

    @property
    def telemetry(self) -> Any:
        """This host's telemetry (``monarch_telemetry.host.HostTelemetry``), which services tell what
        happens; None when the telemetry service is not listed."""
        svc = self.service(telemetry.TelemetryService)
        return svc.tel if svc is not None else None

    def _admit(self, msg_type: type, role: str) -> bool:
        """Who may ask what: the client anything; user code in procs (which holds only the proc key)
        what actors need: say it is ready, ping, answer, and what services allow procs of this host."""
        if role == CLIENT or msg_type in _FROM_ANY_MEMBER:
            return True
        return role == LOCAL_PROC and msg_type in self._from_local_procs

    # -- startup -----------------------------------------------------------

    def start(self) -> str:
        rt = self.rt
        rt.register(m.Ping, self.on_ping)
        rt.register(m.Shutdown, self.on_shutdown)
        for service in self.services:
            worker = SerialWorker(f"service-{service.name}") if service.blocking else None
            if worker is not None:
                self._workers.append(worker)
            for msg_type, handler in service.handlers().items():
                if worker is None:
                    rt.register(msg_type, handler)
                else:
                    rt.register(msg_type, lambda msg, h=handler, w=worker: w.submit(h, msg))
        addr = rt.start().addr
        self._zygote_events_thread = threading.Thread(target=self._zygote_events, name="zygote-events", daemon=True)
        self._zygote_events_thread.start()
        return addr

    # -- what services use -------------------------------------------------

    def send(self, addr: str, msg: Any) -> None:
        """Send ``msg``; a peer that is gone is not an error here (it is logged)."""
        try:
            self.rt.send(addr, msg)
        except Exception as e:
            log.debug("could not send %s to %s: %s", type(msg).__name__, addr, e)

    def reply(self, port: m.PortRef, value: Any, ok: bool = True) -> None:
        self.send(port.addr, m.Reply(port.port_id, 0, ok, value))

    def track_owner(self, owner: str) -> None:
        """Kill every child of ``owner`` when its connection is lost (the client died)."""
        with self.lock:
            if owner in self.owners:
                return
            self.owners.add(owner)
        self.rt.watch(owner, lambda err: self._owner_lost(owner))
        self.rt.mailbox.connect(owner)

    def track_owner_via(self, owner: str, via: str) -> None:
        """Like :meth:`track_owner` for a command ``via`` forwarded (a fan-out tree's parent agent):
        watch ``via``, which this agent is connected to already, rather than open a connection to
        ``owner`` from every host; once ``via`` is gone, watch ``owner`` itself (which may be gone too)."""
        if via == owner:
            self.track_owner(owner)
            return
        with self.lock:
            if owner in self.owners:
                return
            self.owners.add(owner)
            first = via not in self._via_owners
            self._via_owners.setdefault(via, set()).add(owner)
        if first:  # one watch per forwarding agent, however many owners came through it
            self.rt.watch(via, lambda err: self._via_lost(via))
            self.rt.mailbox.connect(via)

    def _via_lost(self, via: str) -> None:
        """The agent that forwarded some owners' commands is gone: watch those owners ourselves."""
        with self.lock:
            owners = self._via_owners.pop(via, set())
            for owner in owners:
                self.owners.discard(owner)
        for owner in owners:
            self.track_owner(owner)

    def owner_gone(self, owner: str) -> None:
        """``owner`` is gone, says the agent that watched it for us (``OwnerGone``): as :meth:`_owner_lost`."""
        with self.lock:
            known = owner in self.owners
            for owners in self._via_owners.values():
                owners.discard(owner)
        if known:
            self._owner_lost(owner)

    def child_env(self, extra: dict) -> dict[str, str]:
        """The environment of a child: the agent's, ``extra`` on top, and ``MONARCH_HOSTNAME``."""
        env = dict(self._base_env)
        env.update({str(k): str(v) for k, v in extra.items()})
        env["MONARCH_HOSTNAME"] = self.host
        return env

    def place_child(self, cwd: str | None, env: dict) -> tuple[str | None, dict]:
        """Where a child starts and its environment, after every service had its say (the workspace mount)."""
        for s in self.services:
            cwd, env = s.place(cwd, env)
        return cwd, env

    def stdio_for(self, rel: str, owner: str = "") -> list[int]:
        """stdout and stderr fds for a child logging to ``<log_dir>/<rel>`` (the caller closes them);
        an owner of a shared agent's own stdout and stderr where it handed them over."""
        place = self.owner_places.get(owner)
        if place is not None:
            return [os.dup(fd) for fd in place[0]]
        if self.inherit_stdio:
            return [1, 2]
        path = os.path.join(self.log_dir, rel)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)  # under the private log folder
        # Through a pipe read by one thread of this agent into the file, so that the file has a cap
        # (MONARCH_RUN_LOG_MAX, as a rank's log: head and tail kept, the middle left out and said so).
        with self.lock:
            if self._proc_logs is None:
                self._proc_logs = LogPump(log_cap(os.environ)[0])
            pump = self._proc_logs
        fd = pump.add(path)
        return [fd, os.dup(fd)]

    def start_child(self, request: dict, fds: list[int], child: Child) -> None:
        """Have the zygote start ``request`` with ``fds`` as its stdio; ``child`` hears what happens."""
        with self.lock:  # held so the "spawned" event cannot be read before this is noted
            rid = self.zygote.request(request, fds)
            self.pending[rid] = child

    def wait_exited(self, children: list[Child], deadline: float) -> bool:
        """Wait until every one of ``children`` has exited (True), or until ``deadline`` (False)."""
        with self.exits:
            return self.exits.wait_for(lambda: all(c.exited is not None for c in children),
                                       max(0.0, deadline - time.monotonic()))

    def owner_cwd(self, owner: str) -> str | None:
        """Where an owner of a shared agent stands (its procs start there), else None."""
        place = self.owner_places.get(owner)
        return place[1] if place is not None else None

    # -- owners and children -------------------------------------------------

    def add_owner_place(self, owner: str, fds: list[int], cwd: str) -> None:
        with self.lock:
            old = self.owner_places.pop(owner, None)
            self.owner_places[owner] = (fds, cwd)
        for fd in old[0] if old else ():
            os.close(fd)

    def release_owner(self, owner: str, wait_s: float) -> None:
        """A shared agent's owner left: stop its children, wait up to ``wait_s`` for them to exit."""
        with self.lock:
            place = self.owner_places.pop(owner, None)
            mine = [c for c in self.children.values() if c.owner == owner]
        for fd in place[0] if place else ():
            os.close(fd)
        self._owner_lost(owner, at_once=True)
        if mine and wait_s > 0:
            self.wait_exited(mine, time.monotonic() + wait_s)

    def _owner_lost(self, owner: str, at_once: bool = False) -> None:
        """``owner`` is gone: reap its children, each after its ``orphan_s`` (the owner's
        ``mesh_orphan_timeout``: 0 at once, None never) unless ``at_once`` (it released them)."""
        with self.lock:
            self.owners.discard(owner)
            victims = [c for c in self.children.values() if c.owner == owner]
            last = not self.owners
        for service in self.services:  # the fan-out service tells the agents it forwarded the owner's runs to
            try:
                service.owner_lost(owner)
            except Exception:
                log.exception("service %s: owner_lost", service.name)
        later: dict[float | None, list] = {}
        for c in victims:
            later.setdefault(0.0 if at_once else c.orphan_s, []).append(c)
        log.info("owner %s is gone; reaping what it owned (%s)", owner,
                 ", ".join(f"{len(cs)} {'never' if d is None else f'after {d:g} s'}" for d, cs in later.items())
                 or "nothing")
        self._reap(later.pop(0.0, []))
        kept = later.pop(None, [])  # mesh_orphan_timeout=None: they run until stopped
        for delay, cs in later.items():
            t = threading.Timer(delay, self._reap, args=(cs,))
            t.daemon = True
            t.start()
        if self.ephemeral and last and not kept:
            if later:  # an agent that only its owner used goes when the last of its orphans does
                t = threading.Timer(max(later), self._stop_if_ownerless)
                t.daemon = True
                t.start()
            else:
                self.request_stop()

    def _reap(self, victims: list) -> None:
        # SIGTERM first: a proc pushes its last telemetry rows (half a second at most), then SIGKILL
        # whatever is left, so an owner's death still reaps everything it owned.
        victims = [c for c in victims if self.children.get(c.pid) is c]  # not one that exited meanwhile
        for c in victims:
            killpg(c.pid, signal.SIGTERM)
        if victims:
            kill = threading.Timer(_REAP_GRACE_S, lambda: [killpg(c.pid, signal.SIGKILL) for c in victims
                                                            if self.children.get(c.pid) is c])
            kill.daemon = True
            kill.start()

    def _stop_if_ownerless(self) -> None:
        with self.lock:
            ownerless = not self.owners
        if ownerless:
            self.request_stop()

    def _zygote_events(self) -> None:
        while True:
            ev = self.zygote.recv_event()
            if ev is None:
                if not self.stopping.is_set():
                    log.error("zygote exited; host agent stops")
                    self.request_stop()
                return
            op = ev["op"]
            try:
                if op == "spawned":
                    self._spawned(ev["id"], ev["pid"])
                elif op == "error":
                    with self.lock:
                        child = self.pending.pop(ev["id"], None)
                    if child is not None:
                        child.on_failed(ev["error"])
                elif op == "exited":
                    self._exited(ev["pid"], ev["code"], ev["reason"])
            except Exception:
                log.exception("zygote event %s failed", op)

    def _spawned(self, rid: int, pid: int) -> None:
        with self.lock:
            child = self.pending.pop(rid, None)
            if child is None:
                return
            child.pid = pid
            self.children[pid] = child
        child.on_started(pid)
        if child.owner and self.rt.death(child.owner) is not None:
            # Its owner died while it was being started, after _owner_lost looked for victims.
            killpg(pid, signal.SIGKILL)

    def _exited(self, pid: int, code: int | None, reason: str) -> None:
        with self.exits:
            child = self.children.pop(pid, None)
            if child is None:
                return
            child.exited = (code, reason)
            self.exits.notify_all()
        child.on_exited(code, reason)

    # -- status and stop -----------------------------------------------------

    def on_ping(self, msg: m.Ping) -> None:
        if self.ephemeral:
            self.track_owner(msg.reply.addr)
        services = {}
        for s in self.services:
            try:
                services[s.name] = s.info()
            except Exception as e:
                services[s.name] = {"error": str(e)}
        info = m.HostInfo(self.host, self.host_rank, os.getpid(), self.rt.addr, self.rt.mailbox.bind_host,
                          self.started_at, self.log_dir, services)
        self.reply(msg.reply, info)

    def on_shutdown(self, msg: m.Shutdown) -> None:
        if msg.reply is not None:
            self.reply(msg.reply, True)
        self.request_stop()

    def request_stop(self) -> None:
        """Ask for an ordered stop (from any thread or a signal handler); returns at once."""
        self.stopping.set()

    def run_until_stopped(self) -> None:
        """Wait for a stop request, then stop in order (on the thread that started the zygote:
        its parent-death signal follows that thread)."""
        # Every stop request sets the event (a signal handler too: it runs during the wait, which
        # then returns), so a long timeout: the 1 s one woke each of 256 idle agents every second.
        while not self.stopping.wait(60.0):
            pass
        self.stop()

    def stop(self, deadline_s: float = _STOP_DEADLINE_S) -> None:
        """Stop every service (last listed first), then the zygote, then the sockets."""
        self.stopping.set()
        deadline = time.monotonic() + deadline_s
        for service in reversed(self.services):
            try:
                service.stop(deadline)
            except Exception:
                log.exception("service %s failed to stop", service.name)
        with self.lock:
            left = list(self.children.values())
        for c in left:  # a child no service knew of any more
            killpg(c.pid, signal.SIGKILL)
        for w in self._workers:
            w.close(deadline)
        if self._proc_logs is not None:  # its procs are gone: the last of their output, then the files' tails
            self._proc_logs.stop(max(deadline, time.monotonic() + _PROC_LOGS_STOP_S))
        self.zygote.stop(time.monotonic() + _ZYGOTE_STOP_S)
        events = getattr(self, "_zygote_events_thread", None)  # ends with the zygote's socket
        if events is not None and events is not threading.current_thread():
            events.join(timeout=max(0.0, deadline - time.monotonic()))
        # What it answered last (a Shutdown's answer, its subtree's in a fan-out) must leave before the
        # sockets close: a message on a new link waits for the peer to accept it, which a loaded peer
        # did only after the close's own linger (then 0.5 s) had dropped it (a tree's leaf read as
        # 'stopped answering').  Bounded: a peer that takes nothing (stopped) does not keep the agent.
        self.rt.mailbox.linger(max(deadline - time.monotonic(), _ANSWERS_LINGER_S))
        self.rt.close()  # lingers (bounded) until what was sent has left, to peers on other hosts too
        self.stopped.set()


def write_json_atomic(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` so a reader never sees half a file (mode 0600; see ``write_atomic``)."""
    write_atomic(path, json.dumps(data).encode())


def _interpreter_first_on_path() -> None:
    """Put this interpreter's bin folder first on PATH for everything the agent runs.

    The agent runs on the interpreter ``monarch serve`` ran on (a venv's python, say), so
    ``python`` and ``torchrun`` in a command mean that environment's, whether or not the
    venv was activated in the shell that served.
    """
    bindir = os.path.dirname(sys.executable)
    if not bindir:
        return
    rest = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != bindir]
    os.environ["PATH"] = os.pathsep.join([bindir, *rest])
    if sys.prefix != sys.base_prefix:
        os.environ["VIRTUAL_ENV"] = sys.prefix


def main(argv: list[str] | None = None, services: Iterable[type[Service]] = SERVICES, *,
         forked: bool = False, keys_fd: int = -1) -> None:
    """Start a host agent with ``services`` and return once it has stopped.

    With ``--fork-hosts FILE``, start one agent per entry of FILE instead (see :func:`fork_hosts`)."""
    p = argparse.ArgumentParser(prog="python -m monarch_agents.host_agent", description="monarch host agent")
    p.add_argument("--host-rank", type=int, default=0)
    p.add_argument("--hostname", default="")
    p.add_argument("--bind", default="", help="address to bind (default: the route to --client-host)")
    p.add_argument("--client-host", default="127.0.0.1", help="where clients connect from")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--agent-file", default="", help="write this agent's address here (JSON)")
    p.add_argument("--keys-file", default="", help="read the job's keys from this JSON file instead of stdin")
    p.add_argument("--log-dir", default="")
    p.add_argument("--ephemeral", action="store_true", help="exit when the last owner disconnects")
    p.add_argument("--inherit-stdio", action="store_true", help="procs write to this process's stdout/stderr")
    p.add_argument("--preload", default="", help="comma-separated modules the zygote imports once")
    p.add_argument("--unix-only", action="store_true",
                   help="listen on a Unix socket only (peer uid checked), no TCP port: a local host's agent")
    p.add_argument("--relay-port", type=int, default=0,
                   help="stand in on this port for a client that reaches hosts only through port-forwards")
    p.add_argument("--shared-socket", default="", help="serve owners on this Unix socket (monarch_agents.local_agent)")
    p.add_argument("--idle-exit", type=float, default=0.0, help="with --shared-socket: exit after this long unowned")
    p.add_argument("--fork-zygote", action="store_true",
                   help="import --preload here and fork the zygote from this process (one interpreter, not two)")
    p.add_argument("--info-fd", type=int, default=-1, help="write the address JSON to this fd, then close it")
    p.add_argument("--fork-hosts", default="", metavar="FILE",
                   help="start one agent per entry of this JSON file ({args, log}), each a fork of this process")
    p.add_argument("--lifeline-fd", type=int, default=-1,
                   help="stop when this pipe closes (its writer, the client that started us, is gone); 0: stdin")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.fork_hosts and not forked:
        at = argv.index("--fork-hosts") if "--fork-hosts" in argv else -1
        common = argv[:at] + argv[at + 2:] if at >= 0 else [a for a in argv if not a.startswith("--fork-hosts=")]
        fork_hosts(args.fork_hosts, common, [x for x in args.preload.split(",") if x], services, args.keys_file)
        return

    logging.basicConfig(level=os.environ.get("MONARCH_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # agent.log (this process's stdout and stderr) under a cap, its newest lines kept: an agent of a
    # long reservation that warns in a loop once filled its host's disk.
    StdioLogCap.install(os.environ)
    _interpreter_first_on_path()
    host = args.hostname or os.environ.get("MONARCH_HOSTNAME") or socket.gethostname()
    try:
        bind = args.bind or route_ip(args.client_host, fallback=None)
    except OSError as e:
        # Loopback instead would be an agent that looks up but that no client can ever reach.
        sys.exit(f"host agent on {host}: no route from this host to the client host {args.client_host} "
                 f"({e.strerror or e}); give an address it can reach (`monarch serve --client-host ADDR`)")
    log_dir = args.log_dir or os.path.join(os.path.expanduser("~"), ".monarch", "logs", host)
    preload = [x for x in args.preload.split(",") if x]
    fork_zygote = forked
    if args.fork_zygote and not forked:
        # A script's own agent: its zygote is a fork of it, so the machine starts one interpreter
        # and imports the runtime once, instead of twice (about a third of a first run's CPU).
        from monarch_agents.zygote import _preload

        # A shared agent's procs belong to other scripts than the one that started it: what sets
        # thread counts at import is left out here, and each proc sets its own (zygote._adopt_environment).
        _preload(preload, neutral=bool(args.shared_socket))
        fork_zygote = True
    # The zygote before any key is in this process: a forked zygote shares this process's memory, and
    # every proc is a fork of it, so user code must find no key of ours there; and it stays dumpable
    # (py-spy for `monarch stack`, same-host RDMA reads between procs).
    zygote = ZygoteClient.fork(preload) if fork_zygote else ZygoteClient.start(preload)
    # Before any key is read: code of the same uid (a rank) may not read this process's memory.
    hardened = not_dumpable()
    keys = _read_keys(args.keys_file, keys_fd)
    agent = HostAgent(keys, host=host, host_rank=args.host_rank, bind_host=bind, log_dir=log_dir,
                      ephemeral=args.ephemeral, preload=preload, inherit_stdio=args.inherit_stdio,
                      services=services, port=args.port, relay_port=args.relay_port, zygote=zygote,
                      unix_only=args.unix_only)
    signal.signal(signal.SIGTERM, lambda *_: agent.request_stop())
    signal.signal(signal.SIGINT, signal.SIG_IGN if args.ephemeral else (lambda *_: agent.request_stop()))
    addr = agent.start()
    listener = None
    if args.shared_socket:
        from monarch_agents.local_agent import DEFAULT_IDLE_S, OwnerListener

        listener = OwnerListener(agent, args.shared_socket, args.idle_exit or DEFAULT_IDLE_S)
        listener.start()
    info = {"addr": addr, "pid": os.getpid(), "host": host, "host_rank": args.host_rank, "ip": bind,
            "log_dir": log_dir, "started_at": agent.started_at, "dumpable": not hardened}
    if args.agent_file:
        write_json_atomic(args.agent_file, info)
    if args.info_fd >= 0:
        with os.fdopen(args.info_fd, "w") as f:
            f.write(json.dumps(info) + "\n")
    else:
        print(json.dumps(info), flush=True)
    if args.lifeline_fd >= 0:
        watch_lifeline(args.lifeline_fd, agent.request_stop)
    try:
        agent.run_until_stopped()
    finally:
        if listener is not None:
            listener.stop(time.monotonic() + _LISTENER_STOP_S)


def _read_keys(keys_file: str, keys_fd: int = -1) -> JobKeys:
    """The job's keys, read once: from ``keys_fd`` (a pipe from the launcher), else ``keys_file``, else stdin."""
    if keys_fd >= 0:
        with os.fdopen(keys_fd) as f:
            return JobKeys(**json.loads(f.readline()))
    if keys_file:
        with open(keys_file) as f:
            return JobKeys(**json.load(f))
    return JobKeys(**json.loads(sys.stdin.readline()))


#: What the launcher imports besides what the zygotes need: the Arrow tables a host's first query
#: loads (pyarrow: ~0.15 CPU-s and ~20 MiB of private memory per agent when each imports it; shared
#: pages when the launcher did).  pyarrow's allocator thread and Arrow's pools are fork-safe.
_LAUNCHER_PRELOAD = ("monarch_telemetry.table", "monarch_telemetry.raw")
#: ...and what a workspace mount process (a fork of each agent's zygote) imports, where installed:
#: then it is a fork's few private pages, not ~18 MiB of its own.
_LAUNCHER_OPTIONAL = ("trio", "pyfuse3", "monarch_rdmafs.fs", "monarch_rdmafs.mount")
#: From this many hosts on, the launcher imports the SQL engine too (see fork_hosts).
_ENGINE_PRELOAD_HOSTS = 16


def fork_hosts(path: str, common: list[str], preload: list[str], services: Iterable[type[Service]],
               keys_file: str = "") -> None:
    """Start many host agents on this machine (the local scheduler's hosts), each a fork of this process.

    ``path`` is a JSON list of ``{"args": [...], "log": FILE}``: each agent runs with ``common`` plus
    its ``args``, in a session of its own (it outlives its starter), its output appended to ``log``;
    with ``"netns": PATH`` (and ``"hostname"``, ``"hosts_file"``) in the namespaces of a ``--netns``
    host (``monarch_agents/hostns.py``).
    What every agent and zygote imports (the agent, its services, the proc agent, ``preload``) is
    imported once here, and the garbage collector's objects frozen, so that a host costs a fork and
    its own few MiB, not two interpreters and their imports (about 0.4 CPU-s and 30 MiB each).
    Prints ``{"pids": [...]}`` once every agent is forked, and returns; the agents run on.
    """
    import gc
    import importlib

    with open(path) as f:
        hosts = json.load(f)
    for mod in [*ALWAYS_PRELOAD, *_LAUNCHER_PRELOAD, *preload]:
        try:
            importlib.import_module(mod)
        except Exception as e:  # the zygotes say so again; a missing optional library only costs speed
            print(f"monarch host agent: could not preload {mod}: {e}", file=sys.stderr)
    for mod in _LAUNCHER_OPTIONAL:
        try:
            importlib.import_module(mod)
        except ImportError:
            pass  # no FUSE here: workspaces are materialized, no mount process is started
    from monarch_agents.fanout import use_tree

    # Queries of a reservation asked through the tree are answered by its first host agent: it warms its engine.
    telemetry.WARM_FIRST_ENGINE = use_tree(len(hosts))
    if len(hosts) >= _ENGINE_PRELOAD_HOSTS:
        # The SQL engine a host imports for its first scan of a table past the raw path's 2,000 rows:
        # ~0.3 CPU-s and ~25 MiB each, 77 CPU-s for 256 hosts; here once, for ~0.3 s more of serve.
        # Imported only (an engine that ran a query has runtime threads, which a fork would lose).
        try:
            importlib.import_module("monarch_telemetry.engine")
        except Exception as e:
            print(f"monarch host agent: could not preload the SQL engine: {e}", file=sys.stderr)
    try:
        from monarch_telemetry.host import warm

        warm()
    except Exception as e:  # only the first query's speed depends on it
        print(f"monarch host agent: could not warm the telemetry tables: {e}", file=sys.stderr)
    gc.freeze()
    pids: list[int] = []
    pipes: list[int] = []
    try:
        for h in hosts:
            pid, w = _fork_host(h, common, services, pipes)
            pids.append(pid)
            pipes.append(w)
        # The keys only now, after every fork: no agent's zygote (nor any proc) was forked with them
        # in its memory.  Each agent reads them from its own pipe.
        not_dumpable()
        line = (json.dumps(_read_keys(keys_file).as_dict()) + "\n").encode()
        for w in pipes:
            os.write(w, line)
    except BaseException:
        for pid in pids:  # nobody would know of them: all or none
            killpg(pid, signal.SIGKILL)
        raise
    finally:
        for w in pipes:
            os.close(w)
    print(json.dumps({"pids": pids}), flush=True)


def _fork_host(h: dict, common: list[str], services: Iterable[type[Service]], siblings: list[int]) -> tuple[int, int]:
    """Fork one agent of :func:`fork_hosts`; its pid, and the pipe its keys are to be written to
    (``siblings``: the pipes of the agents forked before it, which it closes)."""
    log_fd = os.open(h["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    r, w = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        for fd in (log_fd, r, w):
            os.close(fd)
        raise
    if pid != 0:
        os.close(log_fd)
        os.close(r)
        return pid, w
    code = 0
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        for fd in (w, *siblings):
            os.close(fd)
        if h.get("netns"):
            # Before any thread starts (a new mount namespace is refused to a threaded process).
            from monarch_agents.hostns import enter

            enter(h["netns"], h.get("hostname", ""), h.get("hosts_file", ""))
        main([*common, *h["args"]], services, forked=True, keys_fd=r)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def watch_lifeline(fd: int, stop: Callable[[], None]) -> threading.Thread:
    """Call ``stop`` once the pipe ``fd`` reads end-of-file: its writer (the client script that started
    this private agent) is gone, whatever ended it (SIGKILL included), even before it ever pinged us
    (the owner watch starts with the first Ping: a client killed before it left the agent behind)."""
    def watch() -> None:
        try:
            while os.read(fd, 4096):
                pass
        except OSError as e:
            log.warning("lifeline fd %d: %s", fd, e)
        log.info("the client that started this agent is gone; stopping")
        stop()

    t = threading.Thread(target=watch, name="lifeline", daemon=True)
    t.start()
    return t


if __name__ == "__main__":
    main()
