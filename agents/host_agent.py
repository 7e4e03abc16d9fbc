"""The host agent: one long-lived process per reserved host.

It spawns proc agents (forked from its warm zygote), runs commands for
``monarch run`` and ``monarch shell``, reaps them all, and tells each owner the
moment one of its procs exits.  When an owner's connection drops (the client
died), every proc and command it owned is killed: nothing outlives its owner.

Run as ``python -m monarch_agents.host_agent``; it reads the job's keys as JSON on
stdin (never from the command line, where ``ps`` would show them) and writes
its address, atomically, to ``--agent-file``.

What it does not do: restart procs, or reserve hosts (schedulers do that).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import pty
import selectors
import signal
import socket
import struct
import sys
import termios
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from monarch_agents import messages as m
from monarch_agents.runtime import Runtime, install
from monarch_agents.transport import JobKeys, route_ip
from monarch_agents.zygote import ZygoteClient

log = logging.getLogger("monarch.host_agent")

_KILL_GRACE_S = 1.0
_EXIT_DRAIN_S = 1.0


@dataclass
class _Child:
    pid: int
    kind: str  # "proc" | "run" | "shell"
    owner: str
    mesh_id: str = ""
    addr: str = ""
    token: str = ""
    run: "_Run | None" = None
    exited: tuple | None = None


@dataclass
class _Run:
    run_id: str
    rank: int
    reply: m.PortRef
    argv: list
    log_paths: dict
    owner: str = ""
    pid: int = 0
    started: float = field(default_factory=time.time)
    pumps_left: int = 2
    exit: tuple | None = None
    sent_exit: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Signals that came before the zygote said the command started (a rank that fails at once
    #: makes the client stop the others while theirs may still be starting).
    early_signals: list = field(default_factory=list)


@dataclass
class _PendingSpawn:
    msg: m.SpawnProcs
    tokens: dict  # token -> slot index
    infos: list


class HostAgent:
    def __init__(self, keys: JobKeys, *, host: str, host_rank: int, bind_host: str, log_dir: str,
                 ephemeral: bool, preload: list[str], inherit_stdio: bool):
        self.keys = keys
        self.host = host
        self.host_rank = host_rank
        self.log_dir = log_dir
        self.ephemeral = ephemeral
        self.inherit_stdio = inherit_stdio
        self.rt = install(Runtime(keys, bind_host=bind_host, name=f"host-agent[{host}]", host=host))
        self.started_at = time.time()
        self.children: dict[int, _Child] = {}
        self.pending_ids: dict[int, tuple] = {}  # zygote request id -> (kind, context)
        self.spawns: dict[str, _PendingSpawn] = {}  # token -> pending spawn
        # pid -> addr of procs whose ProcReady came before the zygote's "spawned" event was read
        self.early_ready: dict[int, str] = {}
        self.runs: dict[str, _Run] = {}
        self.shells: dict[str, tuple[int, int]] = {}  # shell id -> (master fd, pid)
        self.owners: set[str] = set()
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.zygote = ZygoteClient.start(preload)
        os.makedirs(log_dir, exist_ok=True)

    # -- startup -----------------------------------------------------------

    def start(self) -> str:
        rt = self.rt
        rt.register(m.SpawnProcs, self.on_spawn_procs)
        rt.register(m.ProcReady, self.on_proc_ready)
        rt.register(m.StopProcs, self.on_stop_procs)
        rt.register(m.Ping, self.on_ping)
        rt.register(m.RunCommand, self.on_run)
        rt.register(m.SignalRun, self.on_signal_run)
        rt.register(m.Shutdown, self.on_shutdown)
        rt.register(m.OpenShell, self.on_open_shell)
        rt.register(m.ShellData, self.on_shell_data)
        rt.register(m.ReadLog, self.on_read_log)
        addr = rt.start().addr
        threading.Thread(target=self._zygote_events, name="zygote-events", daemon=True).start()
        return addr

    def _track_owner(self, owner: str) -> None:
        with self.lock:
            if owner in self.owners:
                return
            self.owners.add(owner)
        self.rt.watch(owner, lambda err: self._owner_lost(owner))
        self.rt.mailbox.connect(owner)

    def _owner_lost(self, owner: str) -> None:
        log.info("owner %s is gone; reaping what it owned", owner)
        with self.lock:
            self.owners.discard(owner)
            victims = [c for c in self.children.values() if c.owner == owner and c.exited is None]
        for c in victims:
            _killpg(c.pid, signal.SIGKILL)
        if self.ephemeral and not self.owners:
            self.shutdown()

    # -- procs -------------------------------------------------------------

    def on_spawn_procs(self, msg: m.SpawnProcs) -> None:
        self._track_owner(msg.owner)
        pending = _PendingSpawn(msg, {}, [None] * msg.count)
        for i in range(msg.count):
            token = uuid.uuid4().hex
            pending.tokens[token] = i
            with self.lock:
                self.spawns[token] = pending
            config = {
                "keys": self.keys.as_dict(),
                "host_agent": self.rt.addr,
                "host": self.host,
                "host_rank": self.host_rank,
                "bind_host": self.rt.mailbox.bind_host,
                "token": token,
                "mesh_id": msg.mesh_id,
                "owner": msg.owner,
                "env": msg.env,
            }
            env = dict(os.environ)
            env.update({str(k): str(v) for k, v in msg.env.items()})
            env["MONARCH_HOSTNAME"] = self.host
            fds = self._stdio_for(f"procs/{msg.mesh_id}-{i}.log")
            with self.lock:  # held so the "spawned" event cannot be read before this is noted
                rid = self.zygote.request({"kind": "proc", "config": config, "env": env}, fds)
                self.pending_ids[rid] = ("proc", (msg, token))
            for fd in fds:
                if fd > 2:
                    os.close(fd)

    def _stdio_for(self, rel: str) -> list[int]:
        if self.inherit_stdio:
            return [1, 2]
        path = os.path.join(self.log_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return [fd, os.dup(fd)]

    def on_proc_ready(self, msg: m.ProcReady) -> None:
        with self.lock:
            pending = self.spawns.pop(msg.token, None)
            child = self.children.get(msg.pid)
            if child is not None:
                child.addr = msg.addr
            elif pending is not None:
                # Two threads race here; without its address the proc's death would go unreported.
                self.early_ready[msg.pid] = msg.addr
        if pending is None:
            return
        slot = pending.tokens[msg.token]
        pending.infos[slot] = m.ProcInfo(msg.addr, msg.pid, self.host, self.host_rank)
        if all(i is not None for i in pending.infos):
            self._reply(pending.msg.reply, pending.infos)

    def _spawn_failed(self, msg: m.SpawnProcs, token: str, reason: str) -> None:
        with self.lock:
            pending = self.spawns.pop(token, None)
            if pending is None:
                return
            for t in list(pending.tokens):
                self.spawns.pop(t, None)
        self._reply(pending.msg.reply, RuntimeError(f"proc on {self.host} failed to start: {reason}"), ok=False)

    def on_stop_procs(self, msg: m.StopProcs) -> None:
        with self.lock:
            victims = [c for c in self.children.values() if c.kind == "proc" and c.mesh_id == msg.mesh_id and c.exited is None]
        for c in victims:
            _killpg(c.pid, signal.SIGTERM)
        if victims:
            def force() -> None:
                for c in victims:
                    if c.exited is None:
                        _killpg(c.pid, signal.SIGKILL)
            self.rt.mailbox.call_later(_KILL_GRACE_S, force)
        if msg.reply is not None:
            self._reply(msg.reply, len(victims))

    # -- commands ----------------------------------------------------------

    def on_run(self, msg: m.RunCommand) -> None:
        if msg.owner:
            self._track_owner(msg.owner)
        run_dir = os.path.join(self.log_dir, "runs", msg.run_id)
        os.makedirs(run_dir, exist_ok=True)
        paths = {s: os.path.join(run_dir, f"{msg.rank}.{s}") for s in ("stdout", "stderr")}
        run = _Run(msg.run_id, msg.rank, msg.reply, list(msg.argv), paths, owner=msg.owner)
        with open(os.path.join(run_dir, f"{msg.rank}.json"), "w") as f:
            json.dump({"argv": msg.argv, "rank": msg.rank, "host": self.host, "started": run.started}, f)
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in msg.env.items()})
        env["MONARCH_HOSTNAME"] = self.host
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        with self.lock:
            self.runs[msg.run_id] = run
        with self.lock:  # held so the "spawned" event cannot be read before this is noted
            rid = self.zygote.request({"kind": "exec", "argv": list(msg.argv), "env": env, "cwd": msg.cwd}, [out_w, err_w])
            self.pending_ids[rid] = ("run", run)
        os.close(out_w)
        os.close(err_w)
        threading.Thread(target=self._pump, args=(run, {out_r: "stdout", err_r: "stderr"}, msg.owner),
                         name=f"pump-{msg.run_id}", daemon=True).start()

    def _pump(self, run: _Run, fds: dict[int, str], owner: str) -> None:
        sel = selectors.DefaultSelector()
        files = {s: open(run.log_paths[s], "ab") for s in ("stdout", "stderr")}
        for fd, stream in fds.items():
            sel.register(fd, selectors.EVENT_READ, stream)
        open_fds = set(fds)
        try:
            while open_fds:
                exit_seen = run.exit is not None
                events = sel.select(timeout=_EXIT_DRAIN_S if exit_seen else None)
                if not events and exit_seen:
                    break  # the command exited but something it started keeps the pipe open
                for key, _ in events:
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        open_fds.discard(key.fd)
                        continue
                    files[key.data].write(data)
                    files[key.data].flush()
                    if run.reply.addr:
                        self._send(run.reply.addr, m.RunOutput(run.run_id, run.rank, key.data, data))
        finally:
            for fd in open_fds:
                os.close(fd)
            for f in files.values():
                f.close()
            sel.close()
        with run.lock:
            run.pumps_left = 0
        self._maybe_finish(run)

    def _maybe_finish(self, run: _Run) -> None:
        with run.lock:
            if run.sent_exit or run.exit is None or run.pumps_left:
                return
            run.sent_exit = True
        code, reason = run.exit
        if run.log_paths:  # a shell keeps no logs, so no exit file either
            run_dir = os.path.dirname(run.log_paths["stdout"])
            try:
                with open(os.path.join(run_dir, f"{run.rank}.exit"), "w") as f:
                    json.dump({"code": code, "reason": reason, "ended": time.time()}, f)
            except OSError:
                pass
        if run.reply.addr:
            self._send(run.reply.addr, m.RunExited(run.run_id, run.rank, code, reason))

    def on_signal_run(self, msg: m.SignalRun) -> None:
        with self.lock:
            run = self.runs.get(msg.run_id)
            if run is not None and not run.pid and run.exit is None:
                run.early_signals.append(msg.signum)  # delivered when "spawned" is read
                return
        if run is not None and run.pid and run.exit is None:
            _killpg(run.pid, msg.signum)

    def on_read_log(self, msg: m.ReadLog) -> None:
        run_dir = os.path.join(self.log_dir, "runs", os.path.basename(msg.run_id))
        result: dict[int, Any] = {}
        try:
            for name in os.listdir(run_dir):
                rank_s, _, kind = name.partition(".")
                if kind != msg.stream or not rank_s.isdigit():
                    continue
                with open(os.path.join(run_dir, name), "rb") as f:
                    f.seek(msg.offset)
                    data = f.read(4 << 20)
                done = os.path.exists(os.path.join(run_dir, f"{rank_s}.exit"))
                result[int(rank_s)] = (data, done)
        except FileNotFoundError:
            pass
        self._reply(msg.reply, result)

    # -- shells ------------------------------------------------------------

    def on_open_shell(self, msg: m.OpenShell) -> None:
        self._track_owner(msg.owner)
        master, slave = pty.openpty()
        _set_winsize(master, msg.rows, msg.cols)
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in msg.env.items()})
        env["MONARCH_HOSTNAME"] = self.host
        run = _Run(msg.shell_id, 0, msg.reply, list(msg.argv), {}, owner=msg.owner)
        run.pumps_left = 1
        with self.lock:  # held so the "spawned" event cannot be read before this is noted
            rid = self.zygote.request({"kind": "exec", "argv": list(msg.argv), "env": env, "cwd": msg.cwd, "pty": True},
                                      [slave, slave, slave])
            os.close(slave)
            self.pending_ids[rid] = ("shell", run)
            self.runs[msg.shell_id] = run
            self.shells[msg.shell_id] = (master, 0)
        threading.Thread(target=self._pump_pty, args=(run, master), daemon=True).start()

    def _pump_pty(self, run: _Run, master: int) -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                data = b""
            if not data:
                break
            self._send(run.reply.addr, m.ShellData(run.run_id, data))
        with self.lock:
            self.shells.pop(run.run_id, None)
        os.close(master)
        with run.lock:
            run.pumps_left = 0
        self._maybe_finish(run)

    def on_shell_data(self, msg: m.ShellData) -> None:
        with self.lock:
            entry = self.shells.get(msg.shell_id)
        if entry is None:
            return
        master = entry[0]
        if msg.rows and msg.cols:
            _set_winsize(master, msg.rows, msg.cols)
        if msg.data:
            try:
                os.write(master, msg.data)
            except OSError:
                pass

    # -- zygote events -----------------------------------------------------

    def _zygote_events(self) -> None:
        while True:
            ev = self.zygote.recv_event()
            if ev is None:
                if not self.stopping.is_set():
                    log.error("zygote exited; host agent stops")
                    self.shutdown()
                return
            op = ev["op"]
            if op == "spawned" or op == "error":
                with self.lock:
                    kind, ctx = self.pending_ids.pop(ev["id"], (None, None))
                if kind is None:
                    continue
                if op == "error":
                    if kind == "proc":
                        self._spawn_failed(ctx[0], ctx[1], ev["error"])
                    else:
                        ctx.exit = (127, f"could not start: {ev['error']}")
                        ctx.pumps_left = 0
                        self._maybe_finish(ctx)
                    continue
                pid = ev["pid"]
                early: list[int] = []
                with self.lock:
                    if kind == "proc":
                        msg, token = ctx
                        self.children[pid] = _Child(pid, "proc", msg.owner, mesh_id=msg.mesh_id, token=token,
                                                    addr=self.early_ready.pop(pid, ""))
                    else:
                        ctx.pid = pid
                        self.children[pid] = _Child(pid, kind, ctx.owner, run=ctx)
                        early, ctx.early_signals = ctx.early_signals, []
                    owner = self.children[pid].owner
                for signum in early:
                    _killpg(pid, signum)
                if self.rt.death(owner) is not None:
                    # Its owner died while it was being started, after _owner_lost looked for victims.
                    _killpg(pid, signal.SIGKILL)
            elif op == "exited":
                self._child_exited(ev["pid"], ev["code"], ev["reason"])

    def _child_exited(self, pid: int, code: int | None, reason: str) -> None:
        with self.lock:
            child = self.children.pop(pid, None)
        if child is None:
            return
        child.exited = (code, reason)
        if child.kind == "proc":
            # Kill anything the proc left in its process group.
            _killpg(pid, signal.SIGKILL)
            if child.addr:
                self._send(child.owner, m.ProcDied(child.addr, pid, self.host, reason, code))
            else:
                with self.lock:
                    pending = self.spawns.get(child.token)
                if pending is not None:
                    self._spawn_failed(pending.msg, child.token, reason)
        elif child.run is not None:
            if self.stopping.is_set():
                # The rank did not fail: the reservation is going away under it (`monarch stop`, scancel).
                reason += " (its host agent is shutting down: the reservation was released)"
            child.run.exit = (code if code is not None else 1, reason)
            self._maybe_finish(child.run)

    # -- replies and shutdown ------------------------------------------------

    def _send(self, addr: str, msg: Any) -> None:
        try:
            self.rt.send(addr, msg)
        except Exception as e:
            log.debug("could not send %s to %s: %s", type(msg).__name__, addr, e)

    def _reply(self, port: m.PortRef, value: Any, ok: bool = True) -> None:
        self._send(port.addr, m.Reply(port.port_id, 0, ok, value))

    def on_ping(self, msg: m.Ping) -> None:
        self._track_owner(msg.reply.addr) if self.ephemeral else None
        with self.lock:
            procs = [{"pid": c.pid, "mesh": c.mesh_id, "addr": c.addr, "owner": c.owner}
                     for c in self.children.values() if c.kind == "proc"]
            runs = [{"run_id": r.run_id, "rank": r.rank, "pid": r.pid, "argv": r.argv, "started": r.started}
                    for r in self.runs.values() if r.exit is None and r.log_paths]
        info = m.HostInfo(self.host, self.host_rank, os.getpid(), self.rt.addr, self.rt.mailbox.bind_host,
                          procs, runs, self.started_at, self.log_dir)
        self._reply(msg.reply, info)

    def on_shutdown(self, msg: m.Shutdown) -> None:
        if msg.reply is not None:
            self._reply(msg.reply, True)
        threading.Thread(target=self.shutdown, daemon=True).start()

    def shutdown(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        with self.lock:
            pids = list(self.children)
        for pid in pids:
            _killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + _KILL_GRACE_S
        while time.monotonic() < deadline:
            with self.lock:
                if not self.children:
                    break
            time.sleep(0.02)
        with self.lock:
            for pid in list(self.children):
                _killpg(pid, signal.SIGKILL)
        try:
            os.kill(self.zygote.pid, signal.SIGTERM)
        except OSError:
            pass
        time.sleep(0.05)  # let the last replies leave
        self.rt.close()
        os._exit(0)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    if rows and cols:
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        except OSError:
            pass


def write_json_atomic(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` so a reader never sees half a file (mode 0600)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
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
    p.add_argument("--info-fd", type=int, default=-1, help="write the address JSON to this fd, then close it")
    args = p.parse_args(argv)

    logging.basicConfig(level=os.environ.get("MONARCH_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.keys_file:
        with open(args.keys_file) as f:
            keys = JobKeys(**json.load(f))
    else:
        keys = JobKeys(**json.loads(sys.stdin.readline()))
    host = args.hostname or os.environ.get("MONARCH_HOSTNAME") or socket.gethostname()
    bind = args.bind or route_ip(args.client_host)
    log_dir = args.log_dir or os.path.join(os.path.expanduser("~"), ".monarch", "logs", host)
    agent = HostAgent(keys, host=host, host_rank=args.host_rank, bind_host=bind, log_dir=log_dir,
                      ephemeral=args.ephemeral, preload=[x for x in args.preload.split(",") if x],
                      inherit_stdio=args.inherit_stdio)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=agent.shutdown).start())
    signal.signal(signal.SIGINT, signal.SIG_IGN if args.ephemeral else (lambda *_: threading.Thread(target=agent.shutdown).start()))
    addr = agent.start()
    info = {"addr": addr, "pid": os.getpid(), "host": host, "host_rank": args.host_rank, "ip": bind,
            "log_dir": log_dir, "started_at": agent.started_at}
    if args.agent_file:
        write_json_atomic(args.agent_file, info)
    if args.info_fd >= 0:
        with os.fdopen(args.info_fd, "w") as f:
            f.write(json.dumps(info) + "\n")
    else:
        print(json.dumps(info), flush=True)
    # The main thread stays alive for the zygote's parent-death signal.
    agent.stopping.wait()
    time.sleep(5)


if __name__ == "__main__":
    main()
