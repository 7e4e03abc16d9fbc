"""The per-process runtime: ports, answers, and who has died.

Each host agent and proc agent has exactly one :class:`Runtime`; a client has one per job
it talks to (its meshes of two reservations each go through their own job's keys, see
``monarch_agents.client``), and a message to a peer another of its runtimes talks to is
handed to that one (:func:`claim`).  It owns the :class:`~monarch_agents.transport.Mailbox`, hands
incoming messages to registered handlers, routes :class:`Reply` messages to
open ports, and, when a peer dies, fails every port still waiting on it with a
:class:`SupervisionError` that says which process died and why.

Death is learned two ways: a host agent sends :class:`ProcDied` (with the exit
status) to a proc's owner, and the transport notices any closed connection.
For procs we own we wait a moment for the first before settling for the second,
so the error names the signal or exit code.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Protocol

from monarch_agents.errors import OversizedMessage, SupervisionError
from monarch_agents.future import Future
from monarch_agents.messages import PortRef, ProcDied, Reply, Streamed
from monarch_agents.keys import CLIENT, HOST, PROC
from monarch_agents.transport import FrameTooLong, JobKeys, Mailbox, PeerLost, is_host_agent

log = logging.getLogger("monarch.runtime")

#: How long to wait for a host agent's ProcDied (which has the exit status)
#: after a connection to a proc we own closed.  The host agent must first reap the proc (through
#: its zygote) and send; 0.1 s was too short on a loaded machine, and a SIGSEGV then read
#: "connection lost" instead of its signal.  Only a host that died with its proc pays the wait.
_DEATH_GRACE_S = 2.0
#: A closed runtime's own ZeroMQ context gives its sockets this long to be closed by their users,
#: then closes those left itself (linger 0): ``term()`` alone waits for every socket, forever.
_TERM_GRACE_S = 2.0
#: The sender role of a message this process sent itself.
SELF = "self"


class PortHandler(Protocol):
    def deliver(self, reply: Reply) -> None: ...
    def lost(self, addr: str, error: SupervisionError) -> None: ...


class OneShot:
    """A port that resolves one future with the first answer."""

    __slots__ = ("future", "rt", "port_id", "describe", "restricted")

    def __init__(self, rt: "Runtime", future: Future, describe: Callable[[str], dict] | None = None,
                 restricted: bool = False):
        self.future = future
        self.rt = rt
        self.port_id = 0
        self.describe = describe
        #: An error is rebuilt with the envelope unpickler (monarch's own types only), never a full unpickle.
        self.restricted = restricted

    def deliver(self, reply: Reply) -> None:
        self.rt.close_port(self.port_id)
        if reply.ok:
            self.future.set_result(reply.payload)
        else:
            self.future.set_exception(_as_exception(reply.payload, self.restricted))

    def lost(self, addr: str, error: SupervisionError) -> None:
        self.rt.close_port(self.port_id)
        self.future.set_exception(error)


class StreamPort:
    """A port that receives a stream: every message sent to it goes to ``on_message`` (IO thread).

    Opened with :meth:`Runtime.open_stream`; ``ref`` is what the sender is given.  ``on_lost(addr,
    error)`` is called if a peer it waits on dies.  Close it once the stream has ended.
    """

    __slots__ = ("rt", "port_id", "on_message", "on_lost", "ref")

    def __init__(self, rt: "Runtime", on_message: Callable[[Any], None],
                 on_lost: Callable[[str, SupervisionError], None] | None):
        self.rt = rt
        self.port_id = 0
        self.on_message = on_message
        self.on_lost = on_lost
        self.ref = PortRef("", 0)

    def deliver(self, msg: Any) -> None:
        self.on_message(msg)

    def lost(self, addr: str, error: SupervisionError) -> None:
        if self.on_lost is not None:
            self.on_lost(addr, error)

    def close(self) -> None:
        self.rt.close_port(self.port_id)


class _Relay:
    """Hands every answer it gets to a port of another runtime of this process (see :meth:`Runtime.relay_from`)."""

    __slots__ = ("src", "target", "port_id")

    def __init__(self, src: "Runtime", target: int):
        self.src = src
        self.target = target
        self.port_id = 0

    def deliver(self, reply: Reply) -> None:
        msg = Reply(self.target, reply.rank, reply.ok, reply.payload)
        self.src.mailbox.call_soon(lambda: self.src._on_message(msg))

    def lost(self, addr: str, error: SupervisionError) -> None:
        pass  # a port can have many senders; one dying does not end it


def _as_exception(payload: Any, restricted: bool = False) -> BaseException:
    from monarch_agents import wire
    from monarch_agents.messages import Pickled

    if isinstance(payload, Pickled):
        try:
            payload = wire.loads_envelope(payload.body, payload.buffers) if restricted else payload.load()
        except Exception as e:  # the exception itself could not be rebuilt here (or may not be)
            return RuntimeError(f"remote error could not be decoded: {e}")
    if isinstance(payload, BaseException):
        return payload
    return RuntimeError(str(payload))


class Runtime:
    """This process's endpoint in a monarch job."""

    def __init__(self, keys: JobKeys, *, bind_host: str = "127.0.0.1", name: str = "client", host: str = "",
                 bind_port: int = 0, host_agent: bool = False, admit: Callable[[type, str], bool] | None = None,
                 socks_proxy: str = "", advertise: Callable[[str], str] | None = None, ctx: Any = None,
                 tcp: bool = True):
        """``host_agent``: listen as a host agent (its own server keys); ``admit(type, role)``: which
        senders' messages are handled; ``socks_proxy``/``advertise``: for a client reaching its hosts
        through tunnels (see :class:`~monarch_agents.transport.Mailbox`); ``ctx``: a ZeroMQ context
        of its own (a second runtime in one process: each context has one ZAP handler); ``tcp=False``:
        listen on the Unix socket only (a local host's agent)."""
        self.keys = keys
        self.name = name
        self.host = host or os.environ.get("MONARCH_HOSTNAME") or _hostname()
        self.mailbox = Mailbox(keys, self._on_message, self._on_peer_lost, bind_host=bind_host, bind_port=bind_port,
                               name=name, host=host_agent, admit=admit, on_refused=self._on_refused,
                               socks_proxy=socks_proxy, advertise=advertise, ctx=ctx, tcp=tcp)
        self.addr = ""
        self._own_ctx = ctx
        self._relays: dict[tuple[str, int], PortRef] = {}
        self._ports: dict[int, PortHandler] = {}
        self._waiting: dict[str, set[int]] = defaultdict(set)  # peer addr -> ports waiting on it
        self._port_waits: dict[int, tuple] = {}
        self._host_ports: set[int] = set()  # ports that wait on host agents only (see _from_awaited)
        self._lock = threading.Lock()
        self._handlers: dict[type, Callable[[Any], None]] = {}
        self._death: dict[str, SupervisionError] = {}
        self._watchers: dict[str, list[Callable[[SupervisionError], None]]] = defaultdict(list)
        self._owned: dict[str, dict] = {}  # proc addr -> description (mesh, rank, host)
        self._pending_loss: set[str] = set()
        self.closed = False
        #: Set while this process stops on purpose: the deaths it causes are not reported as failures.
        self.stopping = False

    def start(self) -> "Runtime":
        self.addr = self.mailbox.start()
        return self

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.mailbox.close()
        if self._own_ctx is not None:
            # Its own context (a client's second job): ended in the background, as sockets linger,
            # by a deadline (this thread's owner is that deadline: see _term_context).
            self._term_thread = threading.Thread(target=_term_context, args=(self._own_ctx, time.monotonic() + _TERM_GRACE_S),
                                                 name="zmq-term", daemon=True)
            self._term_thread.start()

    # -- messages ----------------------------------------------------------

    def register(self, msg_type: type, handler: Callable[[Any], None]) -> None:
        """Run ``handler(msg)`` on the IO thread for each message of ``msg_type`` (one handler per type).

        Streams (:class:`~monarch_agents.messages.Streamed`) are not registered: each is read
        through its own port (:meth:`open_stream`), so that several can coexist."""
        if issubclass(msg_type, Streamed):
            raise TypeError(f"{msg_type.__name__} is a stream message: read it through open_stream(), not register()")
        if self._handlers.get(msg_type, handler) is not handler:
            raise ValueError(f"{self.name}: {msg_type.__name__} already has a handler")
        self._handlers[msg_type] = handler

    def send(self, addr: str, msg: Any) -> None:
        """Send ``msg``; raises :class:`SupervisionError` if ``addr`` is known dead."""
        if _peers:
            other = _peers.get(addr)
            if other is not None and other is not self and not other.closed:
                # A peer of another job this client talks to: only that job's keys reach it.
                other.send(addr, msg)
                return
        if addr == self.addr:
            # To an actor this process hosts (or a port it opened): no socket, same order.
            self.mailbox.call_soon(lambda: self._on_own_message(msg))
            return
        err = self._death.get(addr)
        if err is not None:
            if addr not in self.mailbox.stalled:
                raise err
            with self._lock:
                self._revive(addr)
        try:
            self.mailbox.send(addr, msg)
        except PeerLost:
            raise self._death.get(addr) or SupervisionError(f"connection to {addr} was lost")
        except FrameTooLong as e:
            raise OversizedMessage(str(e)) from None

    def _revive(self, addr: str) -> None:
        """``addr`` was lost for reading nothing (``message_delivery_timeout``), not for closing its
        connection: what was pending for it failed; what is sent now tries it afresh, and fails the
        same way if it still reads nothing (under ``_lock``)."""
        self._death.pop(addr, None)
        self.mailbox.stalled.discard(addr)
        self.mailbox.dead.discard(addr)

    def _on_own_message(self, msg: Any) -> None:
        self.mailbox.sender_role = SELF
        self._on_message(msg)

    def _on_message(self, msg: Any) -> None:
        if type(msg) is Reply:
            h = self._ports.get(msg.port_id)
            if h is not None:
                if msg.port_id in self._host_ports and not self._from_awaited(msg.port_id):
                    log.warning("%s: dropped an answer to port %x from a %s key; it waits on host agents",
                                self.name, msg.port_id, self.mailbox.sender_role or "unknown")
                    return
                h.deliver(msg)
            return
        if type(msg) is ProcDied:
            self._on_proc_died(msg)
            return
        handler = self._handlers.get(type(msg))
        if handler is None:
            if isinstance(msg, Streamed):
                port = self._ports.get(msg.port_id)
                if port is not None:
                    port.deliver(msg)
                else:  # the stream's reader is gone (it stopped listening, or never opened it)
                    log.debug("%s: %s for closed port %s", self.name, type(msg).__name__, msg.port_id)
                return
            log.warning("%s: no handler for %s", self.name, type(msg).__name__)
            return
        handler(msg)

    def _on_refused(self, msg: Any, role: str) -> None:
        """A message our policy refused: its sender, if it waits for an answer, hears why."""
        port = getattr(msg, "reply", None)
        if isinstance(port, PortRef) and port.addr:
            err = PermissionError(f"{self.name} refused {type(msg).__name__}: "
                                  f"a {role or 'peer'} key may not ask for it (only the job's client may)")
            try:
                self.send(port.addr, Reply(port.port_id, 0, False, err))
            except Exception as e:
                log.debug("could not tell %s it was refused: %s", port.addr, e)

    # -- ports -------------------------------------------------------------

    def _from_awaited(self, port_id: int) -> bool:
        """Whether the answer being handled may come from its sender: a port that waits only on host
        agents takes answers only from a holder of the client's key (they, or this process), never
        from a proc's key, which any rank or actor holds."""
        if self.keys.role == PROC:
            return True  # a proc: every sender holds what it holds, and a Unix socket cannot tell them apart
        if port_id not in self._host_ports:
            return True
        # HOST: a pod's host agent, which holds the host pair instead of the client's secret.
        return self.mailbox.sender_role in (CLIENT, HOST, SELF)

    def open_port(self, handler: PortHandler, waits_on: list[str] | tuple = ()) -> PortRef:
        """A port routing answers to ``handler``; fails it if a peer in ``waits_on`` dies."""
        waits_on = tuple(waits_on)
        host_only = False
        for a in waits_on:  # a loop, not all(genexpr): one port per call
            host_only = is_host_agent(a)
            if not host_only:
                break
        dead = None
        with self._lock:
            # Random ids (63 bits: telemetry keeps them as int64): a peer cannot guess the port of
            # an answer another one waits for.
            pid = _random_port_id()
            while pid in self._ports:
                pid = _random_port_id()
            if hasattr(handler, "port_id"):  # set before any answer can find the port
                handler.port_id = pid
            self._ports[pid] = handler
            self._port_waits[pid] = waits_on
            if host_only:
                self._host_ports.add(pid)
            for a in waits_on:
                if a in self._death:
                    if a in self.mailbox.stalled:
                        self._revive(a)  # lost for reading nothing: asked afresh (see send)
                    else:
                        dead = (a, self._death[a])
                self._waiting[a].add(pid)
        if dead is not None:
            self.mailbox.call_soon(lambda: handler.lost(*dead))
        return PortRef(self.addr, pid)

    def open_stream(self, on_message: Callable[[Any], None],
                    on_lost: Callable[[str, SupervisionError], None] | None = None,
                    waits_on: list[str] | tuple = ()) -> StreamPort:
        """A port for a stream of :class:`~monarch_agents.messages.Streamed` messages (run output, a
        shell); give its ``ref`` to the sender.  Streams of one kind coexist: each has its own port."""
        port = StreamPort(self, on_message, on_lost)
        port.ref = self.open_port(port, waits_on)
        return port

    def close_port(self, port_id: int) -> None:
        lock = self._lock
        lock.acquire()  # not ``with``: once per call, and nothing below raises
        self._ports.pop(port_id, None)
        self._host_ports.discard(port_id)
        for a in self._port_waits.pop(port_id, ()):
            s = self._waiting.get(a)
            if s is not None:
                s.discard(port_id)
        lock.release()

    def request(self, addr: str, make: Callable[[PortRef], Any], transform: Callable[[Any], Any] | None = None) -> Future:
        """Send ``make(port)`` to ``addr`` and return a future for the one answer."""
        fut: Future = Future(transform)
        handler = OneShot(self, fut, restricted=is_host_agent(addr))
        port = self.open_port(handler, (addr,))
        try:
            self.send(addr, make(port))
        except SupervisionError as e:
            self.close_port(port.port_id)
            fut.set_exception(e)
        return fut

    def relay_from(self, src: "Runtime", ref: PortRef) -> PortRef:
        """A port of this runtime that hands what it gets to ``ref``, a port of ``src`` (another job's
        runtime in this client): a port opened in the client, passed to an actor of this job."""
        key = (ref.addr, ref.port_id)
        with self._lock:
            relay = self._relays.get(key)
        if relay is None:
            relay = self._relays[key] = self.open_port(_Relay(src, ref.port_id))
        return relay

    # -- death ----------------------------------------------------------------

    def own(self, addr: str, description: dict) -> None:
        """Record that this process owns the proc at ``addr`` (its host agent reports its death here)."""
        self._owned[addr] = description
        claim(self, (addr,))

    def disown(self, addr: str) -> None:
        self._owned.pop(addr, None)

    def watch(self, addr: str, fn: Callable[[SupervisionError], None]) -> None:
        """Call ``fn(error)`` on the IO thread once ``addr`` dies."""
        with self._lock:
            err = self._death.get(addr)
            if err is None:
                self._watchers[addr].append(fn)
                return
        self.mailbox.call_soon(lambda: fn(err))

    def death(self, addr: str) -> SupervisionError | None:
        return self._death.get(addr)

    def _on_proc_died(self, msg: ProcDied) -> None:
        d = self._owned.get(msg.addr, {})
        where = d.get("what") or f"proc {msg.addr}"
        err = SupervisionError(f"{where} on host {msg.host} died: {msg.reason}", actor=d.get("actor", ""),
                               rank=d.get("rank"), host=msg.host, exit_code=msg.exit_code)
        self._mark_dead(msg.addr, err)

    def _on_peer_lost(self, addr: str) -> None:
        if addr in self._death:
            return
        if addr in self._owned:
            # A ProcDied with the exit status is on its way from the host agent.
            self.mailbox.call_later(_DEATH_GRACE_S, lambda: self._lost_for_good(addr))
        else:
            self._lost_for_good(addr)

    def _lost_for_good(self, addr: str) -> None:
        if addr in self._death:
            return
        d = self._owned.get(addr, {})
        where = d.get("what") or f"peer {addr}"
        why = self.mailbox.lost_why.pop(addr, "") or "connection lost (process or host died)"
        self._mark_dead(addr, SupervisionError(f"{where} is unreachable: {why}",
                                               rank=d.get("rank"), host=d.get("host", "")))

    def retire(self, addr: str, err: SupervisionError) -> None:
        """``addr`` was stopped on purpose: no supervision, but calls to it fail with ``err``."""
        with self._lock:
            self._watchers.pop(addr, None)
            self._owned.pop(addr, None)
        self.mark_dead(addr, err)

    def mark_dead(self, addr: str, err: SupervisionError) -> None:
        """Declare ``addr`` dead (from any thread)."""
        self.mailbox.call_soon(lambda: self._mark_dead(addr, err))

    def _mark_dead(self, addr: str, err: SupervisionError) -> None:
        with self._lock:
            if addr in self._death:
                return
            self._death[addr] = err
            self.mailbox.dead.add(addr)
            port_ids = self._waiting.pop(addr, set())
            handlers = [self._ports[p] for p in port_ids if p in self._ports]
            watchers = self._watchers.pop(addr, [])
        for h in handlers:
            try:
                h.lost(addr, err)
            except Exception:
                log.exception("port handler failed")
        for w in watchers:
            try:
                w(err)
            except Exception:
                log.exception("death watcher failed")


def _term_context(ctx: Any, deadline: float) -> None:
    """End ZeroMQ context ``ctx`` by ``deadline`` (``time.monotonic()``) plus its sockets' linger.

    ``ctx.term()`` returns only once every socket of the context is closed: one a thread still holds
    (a sender racing the close, a helper whose join timed out) held it, and this thread, forever.
    Their users have until the deadline to close them; those still open then are closed here, with
    no linger (their runtime is closed: what they hold would never be read), and ``term()`` follows."""
    import zmq

    try:
        while time.monotonic() < deadline and any(not sock.closed for sock in list(ctx._sockets)):
            time.sleep(0.02)
        for sock in list(ctx._sockets):
            if not sock.closed:
                sock.close(linger=0)
        ctx.term()
    except zmq.ZMQError as e:  # terminated already
        log.debug("ending a ZeroMQ context: %s", e)


#: Random port ids, drawn from the kernel 4 KiB at a time (a getrandom call per call was ~1% of a
#: busy client), 8 bytes each, through a C iterator: ``next`` on it is one step under the GIL, so
#: two threads never get the same id, and no lock is taken per id (a lock, slicing and
#: int.from_bytes were ~3k instructions a call).  Dropped in a forked child, which must not draw
#: the ids its parent will.
_random_ids: Any = iter(())
_RANDOM_ID = struct.Struct("!Q")


def _random_port_id() -> int:
    """A fresh random 63-bit id."""
    global _random_ids
    t = next(_random_ids, None)
    if t is None:  # used up (two threads may both draw afresh: each gets ids of its own)
        _random_ids = _RANDOM_ID.iter_unpack(os.urandom(4096))
        t = next(_random_ids)
    return (t[0] >> 1) or 1


def _forget_random_pool() -> None:
    global _random_ids
    _random_ids = iter(())


os.register_at_fork(after_in_child=_forget_random_pool)


def _hostname() -> str:
    import socket

    return socket.gethostname()


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


#: In a client talking to several jobs: which of its runtimes talks to a peer address (a host agent
#: of that job's, a proc it spawned there).  Empty in agents and procs, which have one runtime.
_peers: dict[str, Runtime] = {}
#: Every runtime of a client process that talks to more than one job (empty otherwise).
_client_runtimes: list[Runtime] = []


def current() -> Runtime | None:
    """This process's runtime, if one was started (a client of several jobs: the first one's)."""
    return _runtime


def claim(rt: Runtime, addrs: Any) -> None:
    """``rt`` is the runtime that talks to ``addrs``: what this process sends them goes through it.

    Only a client of several jobs keeps this (a process with one runtime has nothing to choose, and
    what no runtime claimed goes through the current one)."""
    if not _client_runtimes or rt is _runtime:
        return
    with _runtime_lock:
        for a in addrs:
            _peers[a] = rt


def add_client_runtime(rt: Runtime) -> None:
    """Another job's runtime in this client (see ``monarch_agents.client.ensure_runtime``)."""
    with _runtime_lock:
        if _runtime is not None and _runtime not in _client_runtimes:
            _client_runtimes.append(_runtime)
        _client_runtimes.append(rt)


def client_runtimes() -> list[Runtime]:
    """Every open runtime of this process (the current one first)."""
    with _runtime_lock:
        rts = [_runtime] if _runtime is not None else []
        return rts + [r for r in _client_runtimes if r is not _runtime and not r.closed]


_pickling = threading.local()


class pickling_for:
    """``with pickling_for(rt): Pickled.of(args)``: what is pickled now goes to a peer of ``rt``, so a
    port of another runtime of this client in it is relayed through ``rt`` (see :func:`port_for_peer`)."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def __enter__(self) -> None:
        self.prev = getattr(_pickling, "rt", None)
        _pickling.rt = self.rt

    def __exit__(self, *exc: Any) -> None:
        _pickling.rt = self.prev


def pickling_dest() -> Runtime | None:
    """The runtime that sends what is being pickled now (see :class:`pickling_for`), if any."""
    return getattr(_pickling, "rt", None)


def own_address(addr: str) -> bool:
    """Whether ``addr`` is one of this client's runtimes (it talks to several jobs)."""
    return bool(_client_runtimes) and any(r.addr == addr for r in client_runtimes())


def port_for_peer(ref: PortRef) -> PortRef:
    """The port to hand a peer for ``ref`` while pickling for it: ``ref`` itself, or, when ``ref`` is a
    port of another of this client's runtimes than the one that sends, a relay on the sender."""
    dest = getattr(_pickling, "rt", None)
    if dest is None or not _client_runtimes or ref.addr == dest.addr:
        return ref
    src = next((r for r in client_runtimes() if r.addr == ref.addr), None)
    return ref if src is None else dest.relay_from(src, ref)


def for_peer(addr: str) -> Runtime | None:
    """The runtime of this process that talks to ``addr``: the one that claimed it, else the current one."""
    rt = _peers.get(addr)
    if rt is not None and not rt.closed:
        return rt
    return _runtime


def install(rt: Runtime) -> Runtime:
    global _runtime
    with _runtime_lock:
        _runtime = rt
    return rt


def uninstall(rt: Runtime | None) -> None:
    """Forget ``rt`` as this process's runtime (it was closed)."""
    global _runtime
    with _runtime_lock:
        if _runtime is rt:
            _runtime = None
        if rt in _client_runtimes:
            _client_runtimes.remove(rt)
        for a in [a for a, r in _peers.items() if r is rt]:
            del _peers[a]


def ensure() -> Runtime:
    """This process's runtime; a client's is started on first use (``monarch_agents.client``)."""
    if _runtime is not None:
        return _runtime
    from monarch_agents.client import ensure_runtime

    return ensure_runtime()
