"""The authenticated transport: one inbound address per process.

Every monarch process (client, host agent, proc agent) owns one
:class:`Mailbox`: a CURVE ROUTER socket bound to one TCP address, read by one
IO thread, and a cache of outbound sockets, one per peer address, that any
thread may send on (each behind its own lock, so sends never wait for the IO
thread).  Messages are one-way; answers go to the sender's own address.

A peer on the same host is reached through the Unix socket that stands for
its TCP address (``monarch_agents/ipc.py``): the sending thread writes the message
itself, large buffers go as shared memory, and no ZeroMQ thread or CURVE
encryption sits in between.  Peers on other hosts get ZeroMQ DEALER sockets.

Big buffers to another host (4 MiB or more in one message) go beside the CURVE connection, on
bulk streams sealed with a key sent through it (``monarch_agents/bulk.py``); messages after one on the
same connection wait until it is whole.

Peers are watched: when the connection to a peer closes (the peer died, or its
host did), ``on_peer_lost(addr)`` runs within milliseconds.  For ZeroMQ peers
socket monitors tell, and ZMTP heartbeats catch peers that vanish without
closing; a Unix socket simply reads end-of-file.

A client that cannot reach its hosts' addresses, nor be reached by them (outside a Kubernetes
cluster), gives a ``socks_proxy`` that opens its connections (through port-forward streams) and
an ``advertise`` function that names an address in the cluster standing for it (a relay, see
``monarch_agents.tunnel``); that address is marked (:func:`is_relayed`) so that no peer mistakes
it for a process of its own host.

Security: the ROUTER is a CURVE server, and a ZAP authenticator admits only the
job's client key, so an unauthenticated peer never gets a message decoded; the
Unix socket applies the same rule with a key handshake (see ``monarch_agents/ipc.py``).
Nothing binds a wildcard address unless the caller passes one.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import ipaddress
import itertools
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from monarch_agents import bulk, ipc, settings, shm, tunnel, wire
from monarch_agents.keys import HOST, LOCAL_PROC, PROC, JobKeys  # noqa: F401  (JobKeys re-exported: callers name it here)
from monarch_agents.unproven import strangers

log = logging.getLogger("monarch.transport")


class _ZmqOnFirstUse:
    """Stands for the ``zmq`` module until something here uses it, then imports it and puts the module
    itself in its place (so later uses cost nothing more): a process whose peers are all on this host
    talks over Unix sockets only (a ``monarch`` command of a local reservation, a local host's agent),
    and pyzmq costs ~7 ms to import, a tenth of a warm ``monarch run``."""

    def __getattr__(self, name: str) -> Any:
        import zmq as module

        globals()["zmq"] = module
        return getattr(module, name)


if TYPE_CHECKING:
    import zmq

    from monarch_agents.zap import KeyGate
else:
    zmq = _ZmqOnFirstUse()

_HWM = 1_000_000
_COPY_THRESHOLD = 1 << 20
_HEARTBEAT_IVL_MS = 1000
_HEARTBEAT_TIMEOUT_MS = 5000
#: How long closing (or exiting) waits for messages still queued: to same-host peers until they
#: read them, to peers on other hosts until their connection is made (ZeroMQ sends what it queued
#: the moment it is; a peer still connecting when the socket closed lost it).  "Send, then exit"
#: must deliver: a proc's last reply, a client's last call.  A peer that never connects is given up
#: at its connect deadline (``_CONNECT_DEADLINE_S``), so this is rarely waited in full.
_LINGER_S = 5.0
#: A peer that has not completed the CURVE handshake by then is treated as gone (sooner under a
#: shorter ``message_delivery_timeout``: see :func:`_liveness_s`).
_CONNECT_DEADLINE_S = 5.0
#: While the IO loop is lent out (``Mailbox.run_until``), the IO thread looks this often whether
#: anyone still runs it, and takes it back when nobody did since the last look; it looks less often
#: (up to the second figure) while one borrower polls all along (an idle proc).
_LEND_CHECK_S = 0.01
_LEND_CHECK_MAX_S = 0.5
#: Monarch's default ``message_delivery_timeout``: a same-host peer that reads none of what we sent
#: for that long is lost (see :meth:`Mailbox._check_delivery`).
_DELIVERY_TIMEOUT_S = 30.0
#: How long an inbound TCP connection has to complete the CURVE handshake.
_HANDSHAKE_IVL_MS = 3000
#: The roles of a proc's key (see ``monarch_agents.keys``): what user code holds.
#: HOST too: a pod's host key is readable by the user code in that pod, so another host agent holds
#: messages sent with it to what it holds a proc's to.
PROC_ROLES = frozenset({PROC, LOCAL_PROC, HOST})
#: A refused message up to this size is decoded to tell its sender why; a bigger one is dropped.
_REFUSED_DECODE_MAX = 64 << 10
#: A big message on a CURVE connection goes as ZeroMQ messages of at most this many bytes each (see
#: ``_send_pieces``): ZMTP's heartbeats pass only between messages, so one that outlasts
#: _HEARTBEAT_TIMEOUT_MS on the wire (160 MiB at 20 MB/s) got its connection declared dead.
_PIECE_BYTES = 4 << 20
_PIECES_HEAD = b"MNRS"  # [head, whole frames...]: the lengths of the frames that follow in pieces
_PIECE = b"MNRs"  # [piece]: the next bytes of those frames
_PIECES = struct.Struct("!4sI")  # magic, how many frames come in pieces; then one !Q length each
#: A message in pieces that gets no piece for this long is dropped (its sender died mid-way: a ROUTER
#: is not told, and what was made for the rest would stay allocated).
_ASSEMBLY_STALL_S = 60.0


#: ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | _PROTOCOL | _AUTH (libzmq's values, spelled out so that
#: importing this module does not import pyzmq; see _ZmqOnFirstUse).
_HANDSHAKE_FAILED = 0x0800 | 0x2000 | 0x4000

_ctx_lock = threading.Lock()
_ctx: zmq.Context | None = None
_ctx_pid = 0


def context() -> zmq.Context:
    """The one ZeroMQ context of this process (a fresh one after fork)."""
    global _ctx, _ctx_pid
    import os

    with _ctx_lock:
        if _ctx is None or _ctx_pid != os.getpid():
            _ctx = zmq.Context()
            _ctx.linger = 500
            _ctx_pid = os.getpid()
        return _ctx


def new_context() -> zmq.Context:
    """A ZeroMQ context apart from the process's (a second client runtime: one ZAP handler each)."""
    ctx = zmq.Context()
    ctx.linger = 500
    return ctx


def reset_context() -> None:
    """The next :func:`context` is a fresh one (after this process's runtime was closed)."""
    global _ctx
    with _ctx_lock:
        _ctx = None


def delivery_timeout_s() -> float:
    """``message_delivery_timeout`` in this process, in seconds."""
    return settings.seconds("message_delivery_timeout", _DELIVERY_TIMEOUT_S)


def _liveness_s(fixed_s: float) -> float:
    """A peer's time to connect, or to answer heartbeats, before it is lost: ours (``fixed_s``), or
    ``message_delivery_timeout`` where that is shorter (a vanished host is noticed in seconds whatever
    the delivery timeout; a shorter one shortens it too)."""
    return max(0.05, min(fixed_s, delivery_timeout_s()))


def _heartbeat_timeout_ms() -> int:
    # At least a second: a peer must have time to answer a heartbeat sent every _HEARTBEAT_IVL_MS.
    return int(max(1.0, _liveness_s(_HEARTBEAT_TIMEOUT_MS / 1000)) * 1000)


def _monitor_event(frames: list[bytes]) -> int:
    """The event id of a socket-monitor message (ZMQ_EVENT_*).

    Parsed here rather than with ``zmq.utils.monitor``, which imports asyncio.
    The first frame is a native-endian uint16 event id followed by an int32 value.
    """
    return struct.unpack("=hi", frames[0][:6])[0]


_same_host: dict[str, bool] = {}


def is_same_host(addr: str) -> bool:
    """Whether ``addr`` is this host: an address of this process's own network stack.

    Decided by the kernel's routing (the source address it would use to reach
    ``addr`` is ``addr`` itself), not by names: a process in another network
    namespace of this machine has its own stack and its own Unix-socket
    namespace, so it is another host to us, as a different machine would be.
    """
    host = addr_host(addr)
    same = _same_host.get(host)
    if same is None:
        try:
            same = ipaddress.ip_address(host).is_loopback or route_ip(host) == host
        except ValueError:
            same = False
        _same_host[host] = same
    return same


#: What a host agent's incarnation starts with: a peer connecting to it uses the host agents' server key.
_HOST_MARK = "h"
#: What a relayed address's incarnation starts with: the process is elsewhere, whatever the host says.
_RELAY_MARK = "r"


def is_relayed(addr: str) -> bool:
    """Whether ``addr`` is a relay standing in for a process elsewhere (reached over TCP, never a Unix socket)."""
    return addr.partition("#")[2].startswith(_RELAY_MARK)


#: After the host mark: the host agent holds no client secret (a pod's), so it cannot check the
#: client's proof in a Unix-socket hello; the client reaches it over TCP, where CURVE proves the client's
#: key by its public half.  (Only a test cluster, whose pods share this machine's network namespace,
#: puts a client on a pod's host at all.)
_NO_CLIENT_KEY_MARK = "s"


def lacks_client_key(addr: str) -> bool:
    """Whether ``addr`` is a host agent that holds no client secret (see ``_NO_CLIENT_KEY_MARK``)."""
    return addr.partition("#")[2].startswith(_HOST_MARK + _NO_CLIENT_KEY_MARK)


def is_host_agent(addr: str) -> bool:
    """Whether ``addr`` is a host agent's (its incarnation is marked; hex digits never start with 'h')."""
    return addr.partition("#")[2].startswith(_HOST_MARK)


def zmq_endpoint(addr: str) -> str:
    """The ZeroMQ endpoint of a monarch address (which ends with ``#`` and the process's incarnation)."""
    return addr.split("#", 1)[0]


def addr_host(addr: str) -> str:
    rest = addr.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0].strip("[]")


class _Peer:
    """A ZeroMQ DEALER to a peer on another host, and its monitor."""

    __slots__ = ("sock", "lock", "monitor", "connected", "created", "refused")

    def __init__(self, sock: zmq.Socket, monitor: zmq.Socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.monitor = monitor
        self.connected = False
        self.created = time.monotonic()
        #: Its handshake failed (it does not take our keys): nothing queued for it will leave, so a
        #: close does not wait for it (:meth:`Mailbox.linger`).
        self.refused = False


class PeerLost(Exception):
    """Sending to a peer whose connection is known to be gone."""


class FrameTooLong(Exception):
    """A message longer than ``codec_max_frame_length``: not sent (the peer is fine)."""

    def __init__(self, addr: str, length: int, limit: int):
        super().__init__(f"rejecting oversize frame: len={length} > max={limit} (not sent to {addr}); increase "
                         "codec_max_frame_length (configure(codec_max_frame_length=...) or HYPERACTOR_CODEC_MAX_FRAME_LENGTH) to allow it")
        self.length = length
        self.limit = limit


class Mailbox:
    """This process's inbound address, its IO thread, and its outbound sockets.

    ``on_message(msg)`` runs on the IO thread for each decoded message, and must
    not block.  ``on_peer_lost(addr)`` runs on the IO thread when a peer we
    have sent to goes away.  ``call_soon(fn)`` runs ``fn`` on the IO thread.
    """

    def __init__(
        self,
        keys: JobKeys,
        on_message: Callable[[Any], None],
        on_peer_lost: Callable[[str], None] | None = None,
        bind_host: str = "127.0.0.1",
        bind_port: int = 0,
        name: str = "mailbox",
        ctx: zmq.Context | None = None,
        local_ipc: bool = True,
        host: bool = False,
        admit: Callable[[type, str], bool] | None = None,
        on_refused: Callable[[Any, str], None] | None = None,
        socks_proxy: str = "",
        advertise: Callable[[str], str] | None = None,
        tcp: bool = True,
    ):
        self.keys = keys
        #: False: listen on the Unix socket only (peer uid checked, then the key handshake), no TCP
        #: port at all: a local host's agent, whose every peer is a process of this host and this user.
        self.tcp = tcp
        self.on_message = on_message
        self.on_peer_lost = on_peer_lost or (lambda addr: None)
        self.bind_host = bind_host
        self.bind_port = bind_port
        self.name = name
        #: A host agent's mailbox: its own server keys, and its address says so (see :func:`is_host_agent`).
        self.host = host
        #: The receiver's policy: ``admit(message type, sender's role)``; a message it refuses is dropped.
        self._admit = admit
        self._on_refused = on_refused or (lambda msg, role: None)
        self.stats_refused = 0
        #: Connections shut as soon as accepted: another local user's process was at the other end.
        self.stats_strangers = 0
        #: A host agent's mailbox guards itself against procs' keys (a controller trusts its own procs,
        #: and a `monarch` command's runtime refuses them by policy; see ``_deliver``).
        self._guard_procs = host
        # A host agent's only: a controller takes big results (tensors) from its procs.
        self.proc_frame_limit = wire.PROC_MAX_FRAME_BYTES if host else wire.MAX_FRAME_BYTES
        #: The role of the message ``on_message`` is handling (IO thread only): the key its sender
        #: proved, ``"client"`` for the client and host agents, ``"proc"``/``"local-proc"`` for procs,
        #: ``"member"`` where a proc's listener cannot tell (see ``monarch_agents.keys``).
        self.sender_role = ""
        self.addr = ""
        # One mailbox per process shares the process context; another one in the same process
        # (tests) needs a context of its own, as each context has a single ZAP handler.
        self._ctx_given = ctx
        self._auth: KeyGate | None = None
        self._router: zmq.Socket | None = None
        self._peers: dict[str, _Peer | ipc.Link] = {}
        self._peers_lock = threading.Lock()
        self._new_monitors: list[tuple[str, zmq.Socket]] = []
        #: ``host:port`` of a SOCKS5 proxy every outbound TCP connection goes through ("" for none).
        self._socks = socks_proxy
        #: The address peers are told to use instead of the bound one (see the module docstring).
        self._advertise = advertise
        self._local_ipc = local_ipc and not socks_proxy and advertise is None
        self._listener: ipc.Listener | None = None
        self._links: dict[int, ipc.Link] = {}  # fd -> link, IO thread only
        self._new_links: list[ipc.Link] = []
        self._connecting: dict[str, threading.Lock] = {}
        self._calls: list[Callable[[], None]] = []
        self._calls_lock = threading.Lock()
        #: A heap of (when, sequence, fn): the loop looks at the first one at every turn.
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._running = False
        self._wake_fd = -1
        self._wake_lock = threading.Lock()
        self._epoll: Any = None
        # fd -> what to do when it is ready, and for ZeroMQ sockets the socket (IO thread only)
        self._handlers: dict[int, Callable[[int], None]] = {}
        self._zmq_fds: dict[zmq.Socket, int] = {}
        self._redrain = False
        self._drained = threading.Condition()
        self._lingering = 0
        # Lending the loop (see run_until): who runs it (a thread ident; 0: nobody, lent out and
        # free), the IO thread's ident, whether it is lent out, asked for, or to be given back, how
        # many times it was taken, how many threads wait the usual way, and the IO thread's bed.
        self._owner = 0
        self._io_ident = 0
        self._own_lock = threading.Lock()
        self._lent = False
        self._lend_asked = False
        self._give_back = False
        self._io_long = False
        self._lent_gen = 0
        self._sleepers = 0
        self._park = threading.Lock()
        self._park.acquire()
        self.dead: set[str] = set()
        # Big buffers to peers on other hosts (monarch_agents/bulk.py): the sending side, made on
        # first use; the peers whose receiver never reached our bulk port (CURVE carries all then);
        # the connections (ROUTER routing ids) whose messages wait behind a bulk fetch (IO thread
        # only); the transfers received whole lately (so that a copy resent inline is dropped).
        self._outbox: bulk.Outbox | None = None
        self._inbox = bulk.Inbox()
        self._no_bulk: set[str] = set()
        self._held: dict[bytes, list[tuple[list[Any], str]]] = {}
        #: Messages coming in pieces, by connection (IO thread only; see ``_send_pieces``).
        self._assembling: dict[bytes, _Assembly] = {}
        self._fetched_ids: dict[bytes, None] = {}
        self._local_ips: dict[str, str] = {}
        #: Why a peer this mailbox declared gone is gone, in words, when it was not a closed connection.
        self.lost_why: dict[str, str] = {}
        #: Peers never given up on for reading nothing (``message_delivery_timeout``): a proc's
        #: owners, whose answers must wait for them (a client in Ctrl-Z gets them when it goes on).
        self.patient: Callable[[str], bool] | None = None
        #: Peers lost because they read nothing (not because they closed): what was pending for them
        #: failed, and the next message sent to one tries it afresh (it may have gone on since).
        self.stalled: set[str] = set()
        self.stats_received = 0
        self.stats_dropped = 0

    # -- lifecycle ---------------------------------------------------------

    @property
    def _ctx(self) -> zmq.Context:
        """The ZeroMQ context (made on first use: a Unix-socket-only mailbox with only same-host peers
        never needs one)."""
        if self._ctx_given is None:
            self._ctx_given = context()
        return self._ctx_given

    def start(self) -> str:
        """Bind and start the IO thread; returns the bound address."""
        public, secret = self.keys.host_server if self.host else (self.keys.server_public, self.keys.server_secret)
        if not secret:
            raise ValueError(f"{self.name}: these keys cannot listen as a {'host agent' if self.host else 'member'}")
        if not self.tcp:
            return self._start_unix_only()
        from monarch_agents.zap import KeyGate  # CURVE's gate: only for a TCP listener

        self._auth = KeyGate(self._ctx, {k.encode(): role for k, role in self.keys.admitted().items()})
        r = self._ctx.socket(zmq.ROUTER)
        r.curve_server = True
        r.curve_secretkey = secret.encode()
        r.curve_publickey = public.encode()
        r.rcvhwm = _HWM
        # ZeroMQ drops a peer that announces a longer frame before allocating it.
        r.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        r.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
        r.setsockopt(zmq.HEARTBEAT_TIMEOUT, _heartbeat_timeout_ms())
        # A connection that has not proved a job key by then is closed: anyone who can reach the
        # port may open connections, and idle ones must not hold our descriptors (ZeroMQ's default: 30 s).
        r.setsockopt(zmq.HANDSHAKE_IVL, _HANDSHAKE_IVL_MS)
        raise_fd_limit()
        host = self.bind_host
        fmt = f"tcp://[{host}]" if ":" in host else f"tcp://{host}"
        if self.bind_port:
            r.bind(f"{fmt}:{self.bind_port}")
        else:
            r.bind(f"{fmt}:*")
        # The address names this process, not just its port: a port freed by a dead proc is soon
        # bound again, and what is known about the dead one (its death, its owner) must not stick
        # to the new one.  ZeroMQ connects to the part before the '#'.
        incarnation = os.urandom(6).hex()
        endpoint = r.getsockopt_string(zmq.LAST_ENDPOINT)
        if self._advertise is not None:
            try:
                self.addr = f"{self._advertise(endpoint)}#{_RELAY_MARK}{incarnation}"
            except BaseException:
                r.close(0)
                raise
        else:
            self.addr = f"{endpoint}#{self._mark()}{incarnation}"
        self._router = r
        if self._local_ipc:
            try:
                self._listener = ipc.Listener(self.addr, self.keys, host=self.host)
            except OSError as e:  # taken, or no abstract sockets here: peers on this host use TCP
                log.warning("%s: no Unix socket for %s (%s); same-host peers use TCP", self.name, self.addr, e)
        return self._start_loop()

    def _mark(self) -> str:
        return (_HOST_MARK + (_NO_CLIENT_KEY_MARK if self.keys.role == HOST else "")) if self.host else ""

    def _start_unix_only(self) -> str:
        if not self._local_ipc:
            raise ValueError(f"{self.name}: a Unix-socket-only mailbox cannot use a SOCKS proxy or an advertised address")
        # The address keeps the TCP form every peer parses (host for routing, '#' incarnation for the
        # socket name); port 0 is never bound, so a peer that cannot use the Unix socket finds nothing.
        host = self.bind_host
        self.addr = f"tcp://[{host}]:0" if ":" in host else f"tcp://{host}:0"
        self.addr += f"#{self._mark()}{os.urandom(6).hex()}"
        self._listener = ipc.Listener(self.addr, self.keys, host=self.host)  # no fallback: fail loudly
        return self._start_loop()

    def _start_loop(self) -> str:
        self._epoll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._running = True
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-io", daemon=True)
        self._thread.start()
        if not self.host:
            # A host agent never gives up on a peer that stopped reading (a client in Ctrl-Z, a
            # `monarch debug` whose terminal is paused): it keeps a window per stream and waits,
            # and a dead peer still closes its connection.  Clients and procs apply the timeout.
            self.call_later(1.0, self._check_delivery)
        atexit.register(self.linger)
        return self.addr

    def close(self, deadline: float | None = None) -> None:
        """Stop the IO thread (waiting for it until ``deadline``, ``time.monotonic()``; default 2 s
        from now) and close every socket. Safe to call twice."""
        if not self._running:
            return
        if deadline is None:
            deadline = time.monotonic() + 2.0
        atexit.unregister(self.linger)
        self.linger()
        self._running = False
        self.wake()
        with self._own_lock:
            if self._park.locked():
                self._park.release()  # a parked IO thread (the loop lent out) ends too
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._peers_lock:
            peers, self._peers = self._peers, {}
            new_links, self._new_links = self._new_links, []
        for p in peers.values():
            if isinstance(p, ipc.Link):
                p.close()
                continue
            try:
                p.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            p.monitor.close(0)
            p.sock.close()
        for link in [*self._links.values(), *new_links]:
            link.close()
        self._links.clear()
        self._inbox.close()
        if self._outbox is not None:
            self._outbox.close()
        if self._listener is not None:
            self._listener.close()
        if self._auth is not None:
            self._auth.stop(deadline)

    # -- sending -----------------------------------------------------------

    def _peer(self, addr: str) -> _Peer | ipc.Link:
        p = self._peers.get(addr)
        if p is not None:
            return p
        with self._peers_lock:
            connecting = self._connecting.setdefault(addr, threading.Lock())
        with connecting:  # one connection per peer, however many threads send to it first
            with self._peers_lock:
                p = self._peers.get(addr)
                if p is not None or addr in self.dead:
                    self._connecting.pop(addr, None)
                    if p is None:  # declared dead (and its socket closed) since the caller looked
                        raise PeerLost(addr)
                    return p
            local = (self._local_ipc and not is_relayed(addr) and is_same_host(addr)
                     and not (self.keys.client_secret and lacks_client_key(addr)))
            link = ipc.connect(addr, self.keys, is_host_agent(addr)) if local else None
            with self._peers_lock:
                self._connecting.pop(addr, None)
                if link is None and local and "#" in addr and self._listener is not None:
                    # Unix sockets work here, and every process of this host listens on one: the
                    # process is gone.  (TCP would reach whoever has its port now.)
                    self.dead.add(addr)
                    self.call_soon(lambda: self.on_peer_lost(addr))
                    raise PeerLost(addr)
                if link is not None:
                    self._peers[addr] = p = link
                    self._new_links.append(link)
                else:
                    p = self._zmq_peer(addr)
        self.wake()
        deadline_s = _liveness_s(_CONNECT_DEADLINE_S)
        self.call_later(deadline_s, lambda: self._check_connected(addr, deadline_s))
        return p

    def _zmq_peer(self, addr: str) -> _Peer:
        """A DEALER to ``addr`` (under the peers lock)."""
        s = self._ctx.socket(zmq.DEALER)
        server_public = self.keys.host_server[0] if is_host_agent(addr) else self.keys.server_public
        public, secret = self.keys.identity
        s.curve_serverkey = server_public.encode()
        s.curve_publickey = public.encode()
        s.curve_secretkey = secret.encode()
        s.sndhwm = _HWM
        s.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, _heartbeat_timeout_ms())
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        if self._socks:
            s.setsockopt(zmq.SOCKS_PROXY, self._socks.encode())
            s.setsockopt(zmq.SOCKS_USERNAME, b"monarch")
            s.setsockopt(zmq.SOCKS_PASSWORD, tunnel.token(self.keys).encode())
        mon = s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                                   | _HANDSHAKE_FAILED)
        try:
            s.connect(zmq_endpoint(addr))
        except zmq.ZMQError:
            # A malformed address (say, from a corrupted message): close what we made,
            # or each try leaks three sockets until the context has none left.
            _close_quietly(s, mon)
            raise
        p = _Peer(s, mon)
        self._peers[addr] = p
        self._new_monitors.append((addr, mon))
        return p

    def _check_connected(self, addr: str, deadline_s: float = _CONNECT_DEADLINE_S) -> None:
        p = self._peers.get(addr)
        if p is not None and not p.connected and addr not in self.dead:
            log.warning("%s: could not connect to %s within %.1f s", self.name, addr, deadline_s)
            self._lose(addr, f"could not connect within {deadline_s:g} s")

    def _lose(self, addr: str, why: str) -> None:
        """Declare ``addr`` gone, saying why (IO thread only)."""
        self.dead.add(addr)
        self.lost_why[addr] = why
        self._close_peer(addr)
        self.on_peer_lost(addr)

    def _check_delivery(self) -> None:
        """Every same-host peer we have sent to and that has read none of it for
        ``message_delivery_timeout`` is lost, as Monarch's channel is (IO thread, periodically).

        A Unix socket tells how much of what we wrote its reader has not taken yet
        (``Link.stalled_for``); a stopped or wedged process takes nothing, a busy one keeps
        reading.  Peers on other hosts are watched by ZeroMQ heartbeats (:func:`_liveness_s`)."""
        if not self._running:
            return
        limit = delivery_timeout_s()
        now = time.monotonic()
        self._add_timer(now + max(0.05, min(1.0, limit / 4)), self._check_delivery)  # first: whatever fails
        with self._peers_lock:
            links = [(a, p) for a, p in self._peers.items() if type(p) is ipc.Link]
        patient = self.patient
        for addr, link in links:
            stalled = link.stalled_for(now)
            if stalled > limit and addr not in self.dead and not (patient is not None and patient(addr)):
                log.warning("%s: %s took none of our messages for %.1f s (message_delivery_timeout)",
                            self.name, addr, stalled)
                self.stalled.add(addr)
                self._lose(addr, f"a message was not delivered within message_delivery_timeout ({limit:g} s): "
                                 "the process took none (stopped or wedged)")

    def connect(self, addr: str) -> None:
        """Open the connection to ``addr`` now, so its loss is noticed even before we send."""
        try:
            self._peer(addr)
        except PeerLost:
            pass  # already known dead, and so already reported

    def send(self, addr: str, msg: Any) -> None:
        """Send ``msg`` to the process at ``addr``. Thread-safe; never blocks on the IO thread."""
        if addr in self.dead:
            if addr not in self.stalled:
                raise PeerLost(addr)
            self.stalled.discard(addr)  # given up on for reading nothing: try it afresh
            self.dead.discard(addr)
        p = self._peer(addr)
        if type(p) is ipc.Link:
            fds: list[int] = []
            frames = wire.encode(msg, fds=fds if p.same_host else None)
            if len(frames) > 2 or len(frames[1]) >= settings.CHECK_FROM:
                try:
                    _check_length(addr, frames)
                except FrameTooLong:
                    for fd in fds:
                        os.close(fd)
                    raise
            try:
                drain = p.send(frames, fds)
            except ipc.PeerGone:
                raise PeerLost(addr) from None
            if drain:
                self.call_soon(lambda: self._watch_writable(p))
            return
        frames = wire.encode(msg)
        if len(frames) > 2 or len(frames[1]) >= settings.CHECK_FROM:
            _check_length(addr, frames)
        self._send_zmq(addr, frames, p)

    def _send_zmq(self, addr: str, frames: list[Any], p: _Peer) -> None:
        big = any(_nbytes(f) >= _COPY_THRESHOLD for f in frames[2:])
        if big and self._owner != threading.get_ident() and addr not in self._no_bulk:
            # Not from the loop's thread: it starts the fetches of what peers send us, and two IO
            # threads each waiting for the other to fetch would wait for CONNECT_S.
            frames = self._send_bulk(addr, frames, p)
            if not frames:
                return
        sends = _pieces(frames) if big and sum(_nbytes(f) for f in frames) > _PIECE_BYTES else [frames]
        trackers = []
        # Never block: the IO thread sends too (replies), and a DEALER with no pipe to its
        # peer would wait forever.  With the pipe there, only a full queue says Again.  Pieces
        # are queued under one hold of the lock: nothing else of ours comes between them.
        with p.lock:
            try:
                for part in sends:
                    if big:
                        trackers.append(p.sock.send_multipart(part, zmq.NOBLOCK, copy=False, track=True))
                    else:
                        p.sock.send_multipart(part, zmq.NOBLOCK)
            except zmq.Again:
                raise PeerLost(addr) from None
            except zmq.ZMQError:
                if p.sock.closed:  # the peer was declared dead meanwhile and its socket closed
                    raise PeerLost(addr) from None
                raise
        # The caller may reuse its buffer as soon as we return: wait until sent (or
        # dropped, when the peer dies and its socket is closed).
        for tracker in trackers:
            tracker.wait()

    def _send_bulk(self, addr: str, frames: list[Any], p: _Peer) -> list[Any]:
        """Send ``frames`` with their big buffers over bulk streams (see ``monarch_agents/bulk.py``).

        Returns [] when the peer has it all, else the frames to send on the CURVE connection instead.
        """
        idx = [i for i in range(2, len(frames)) if _nbytes(frames[i]) >= bulk.MIN_FRAME]
        # Not through a relay either way: the receiver connects back to where our connection comes
        # from, and a relay's address is not ours (it would wait CONNECT_S to learn that).
        if (sum(_nbytes(frames[i]) for i in idx) < bulk.MIN_BYTES or self._socks or self._advertise is not None
                or is_relayed(addr)):
            return frames
        try:
            if self._outbox is None:
                with self._peers_lock:
                    if self._outbox is None:
                        self._outbox = bulk.Outbox(self.name)
            if not self._outbox.available:
                return frames
            host = addr_host(addr)
            local_ip = self._local_ips.get(host)
            if local_ip is None:
                # The address our CURVE connection to the peer comes from: the one the receiver
                # sees it from and connects back to.
                local_ip = self._local_ips[host] = route_ip(host, None)
            why, desc, reached = self._outbox.send(addr, local_ip, frames, idx,
                                                   lambda small: self._send_small(addr, small, p),
                                                   lambda: addr not in self.dead and not p.sock.closed)
        except (OSError, bulk.BulkError) as e:
            log.warning("%s: no bulk path to %s (%s): big messages go on its CURVE connection", self.name, addr, e)
            self._no_bulk.add(addr)
            return frames
        if not why:
            return []
        if addr in self.dead:
            raise PeerLost(addr)
        if not reached:
            self._no_bulk.add(addr)
        log.warning("%s: a bulk transfer to %s failed (%s); it goes on the CURVE connection", self.name, addr, why)
        return bulk.inline_frames(desc, frames)

    def _send_small(self, addr: str, frames: list[Any], p: _Peer) -> None:
        with p.lock:
            try:
                p.sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                raise PeerLost(addr) from None
            except zmq.ZMQError:
                if p.sock.closed:
                    raise PeerLost(addr) from None
                raise

    def linger(self, timeout: float = _LINGER_S) -> None:
        """Wait, at most ``timeout``, until what was sent has left this process: read by same-host
        peers, and to peers on other hosts, their connections made (a ZeroMQ socket closed while its
        peer's handshake was under way dropped what it held for it)."""
        if not self._running or threading.current_thread() is self._thread or self._owner == threading.get_ident():
            return

        def drained() -> bool:
            with self._peers_lock:
                peers = list(self._peers.values())
            # A peer not connected yet is still in its connect deadline: one that misses it is
            # declared dead and leaves _peers (_check_connected), which ends the wait for it.
            return not any(link.pending and not link.closed if type(link) is ipc.Link
                           else not (link.connected or link.refused) for link in peers)

        with self._drained:
            self._lingering += 1
            try:
                self._drained.wait_for(drained, timeout)
            finally:
                self._lingering -= 1

    def wake(self) -> None:
        with self._wake_lock:  # so the IO thread cannot close the fd (and its number be reused) meanwhile
            if self._wake_fd >= 0:
                os.eventfd_write(self._wake_fd, 1)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the IO thread."""
        with self._calls_lock:
            self._calls.append(fn)
        self.wake()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the IO thread after ``delay`` seconds."""
        self.call_soon(lambda: self._add_timer(time.monotonic() + delay, fn))

    def _add_timer(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_seq), fn))  # IO thread only

    def forget(self, addr: str) -> None:
        """Close the socket to ``addr`` (it will be reopened on the next send)."""
        self.call_soon(lambda: self._close_peer(addr))

    def _close_peer(self, addr: str) -> None:
        """Close the sockets to ``addr`` (IO thread only).

        Done for every peer declared dead: a long-lived host agent outlives many
        clients, and three sockets kept per dead peer would use up the context.
        Anything still queued for the peer is dropped, which also releases a
        sender waiting in :meth:`_send_zmq` for a big message to leave.
        """
        with self._peers_lock:
            p = self._peers.pop(addr, None)
            if p is None:
                return
            if type(p) is ipc.Link:
                self._new_links = [link for link in self._new_links if link is not p]
        if type(p) is ipc.Link:
            self._drop_link(p)
            return
        if self._outbox is not None:
            self._outbox.fail_peer(addr)
        with self._peers_lock:
            self._new_monitors = [(a, mon) for a, mon in self._new_monitors if mon is not p.monitor]
        fd = self._zmq_fds.pop(p.monitor, None)
        if fd is not None:
            self._unwatch(fd)
        with p.lock:
            _close_quietly(p.sock, p.monitor)

    # -- the IO thread -----------------------------------------------------

    def _watch(self, fd: int, events: int, handler: Callable[[int], None]) -> None:
        self._handlers[fd] = handler
        self._epoll.register(fd, events)

    def _unwatch(self, fd: int) -> None:
        if self._handlers.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass

    def _watch_zmq(self, sock: zmq.Socket, handler: Callable[[int], None]) -> None:
        # A ZeroMQ socket's FD only says "look again": each handler reads until Again.
        fd = sock.getsockopt(zmq.FD)
        self._zmq_fds[sock] = fd
        self._watch(fd, select.EPOLLIN, handler)

    def _loop(self) -> None:
        """The IO thread: one epoll over the ROUTER, the Unix sockets, monitors and the wake-up fd.

        epoll rather than ``zmq.Poller``: most traffic is on plain sockets, and
        zmq_poll plus its enum results cost more per message than the rest of
        the loop.  A thread that waits for what the loop brings may run the loop
        itself instead (:meth:`run_until`): the IO thread then parks.
        """
        router = self._router
        accepted = None
        if router is not None:
            self._watch_zmq(router, lambda ev: self._drain(router))
            # Each connection the ROUTER accepts is told here (its descriptor), so that one whose
            # other end is another local user's socket is shut at once, not after the handshake's
            # deadline: another user could otherwise hold as many of our descriptors as they open
            # connections in _HANDSHAKE_IVL_MS (a loaded 2-core machine: ~1,500).
            accepted = router.get_monitor_socket(zmq.EVENT_ACCEPTED)
            self._watch_zmq(accepted, lambda ev: self._shed_strangers(accepted))
            self._shed_strangers(accepted)  # reading it once arms its descriptor's signal
        self._watch(self._wake_fd, select.EPOLLIN, self._on_wake)
        listener = self._listener
        if listener is not None:
            self._watch(listener.fd, select.EPOLLIN, lambda ev: self._accept(listener))
        self._owner = self._io_ident = threading.get_ident()
        try:
            while self._running:
                self._turn(-1.0)
                if self._lend_asked and not self._sleepers:
                    self._lend_out()
        finally:
            self._end_lending()
            if accepted is not None:
                with contextlib.suppress(zmq.ZMQError):
                    router.disable_monitor()
                accepted.close(0)
            if router is not None:
                router.close(0)
            self._epoll.close()
            with self._wake_lock:
                fd, self._wake_fd = self._wake_fd, -1
            os.close(fd)

    def _turn(self, limit: float) -> None:
        """One turn of the loop: wait for what is ready (at most ``limit`` seconds; -1: until
        something is), handle it, then what was asked of the loop and the timers that are due.
        Run by one thread at a time: the IO thread, or the thread it lent the loop to."""
        router = self._router
        timeout = limit
        if self._redrain:
            timeout = 0.0
        elif self._timers:
            t = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = t if timeout < 0 else min(t, timeout)
        handlers = self._handlers
        for fd, ev in self._epoll.poll(timeout):
            h = handlers.get(fd)
            if h is not None:
                h(ev)
        if self._redrain and router is not None:
            self._redrain = False
            self._drain(router)
        if self._new_monitors:
            with self._peers_lock:
                new, self._new_monitors = self._new_monitors, []
            for addr, mon in new:
                self._watch_zmq(mon, lambda ev, mon=mon, addr=addr: self._monitor_event(mon, addr))
                self._monitor_event(mon, addr)  # what came before it was watched
        if self._new_links:
            with self._peers_lock:
                links, self._new_links = self._new_links, []
            for link in links:
                self._add_link(link)
        if self._calls:
            with self._calls_lock:
                calls, self._calls = self._calls, []
            for fn in calls:
                self._guard(fn)
        timers = self._timers
        if timers and timers[0][0] <= time.monotonic():
            now = time.monotonic()
            due = []
            while timers and timers[0][0] <= now:
                due.append(heapq.heappop(timers)[2])
            for fn in due:  # after taking them all: what they add waits for the next turn
                self._guard(fn)
        if self._lingering:  # someone waits for queued messages to leave: tell them
            with self._drained:
                self._drained.notify_all()

    # -- lending the loop --------------------------------------------------
    #
    # A call's round trip used to hand the message between threads at both ends: the proc's IO
    # thread read the call and woke the actor's thread, and the client's IO thread read the answer
    # and woke the caller.  On 2 cores each such hand-over (a futex wake, a context switch, the GIL
    # passed on) cost about as much as all the Python work of the message.  So a thread about to
    # sleep until the loop brings it something (an actor's thread with an empty mailbox, see
    # ``proc_agent``) may run the loop itself: the IO thread lends it out and parks, and looks
    # every ``_LEND_CHECK_S`` whether anyone still runs it; when nobody has for that long (the
    # borrower went on to run an endpoint), it takes the loop back, so what nobody waits for
    # (another actor's call, a stop, a death) waits at most about twice that.  While a borrower
    # keeps polling, the IO thread looks less and less often (an idle proc costs no wake-ups), and
    # the borrower wakes it when it stops polling after such a long while.

    def run_until(self, ready: Callable[[], bool], timeout: float | None = None) -> bool | None:
        """Run the loop on this thread until ``ready()`` (or ``timeout`` seconds); returns
        ``ready()``.  None when the loop cannot be borrowed now (the IO thread runs it, or another
        thread does): wait the usual way then (the IO thread lends it out after its current turn,
        for the next time).  ``ready`` must become true only through the loop, or its setter must
        call :meth:`wake_borrower`."""
        me = threading.get_ident()
        lock = self._own_lock
        lock.acquire()
        if not self._lent or self._owner:
            if not self._lent and self._running and self._owner != me:
                self._lend_asked = True  # seen at the end of the IO thread's turn: no wake-up
            lock.release()
            return None
        self._owner = me
        self._lent_gen += 1
        lock.release()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not ready():
                if not self._running:
                    break
                if deadline is None:
                    self._turn(-1.0)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._turn(left)
        except (OSError, ValueError):
            if self._running:
                raise
            # closed under us (its epoll with it): the caller waits the usual way
        finally:
            lock.acquire()
            self._owner = 0
            if (self._io_long or self._sleepers or not self._running) and self._park.locked():
                # The IO thread sleeps long, or others wait the usual way for what the loop
                # brings: it looks now (and takes the loop back if nobody else polls).
                self._give_back = bool(self._sleepers) or not self._running
                self._park.release()
            lock.release()
        return ready()

    def wake_borrower(self) -> None:
        """Wake the thread that runs the loop in :meth:`run_until`, if another thread does (called by
        a thread that made its ``ready()`` true without the loop)."""
        o = self._owner
        if o and self._lent and o != threading.get_ident():
            self.wake()

    def sleep_begin(self, waiter: Any) -> None:
        """``waiter`` (an object with a ``_sleeping`` attribute: a future, an actor's mailbox) is
        about to sleep the usual way until the loop brings it something: while any does, the loop
        is not lent out, and a borrower that stops polling hands it back at once."""
        with self._own_lock:
            if waiter._sleeping is None:
                waiter._sleeping = self
                self._sleepers += 1

    def sleep_end(self, waiter: Any) -> None:
        """``waiter`` got what it waited for (called by whoever gave it, or by the waiter)."""
        with self._own_lock:
            if waiter._sleeping is self:
                waiter._sleeping = None
                self._sleepers -= 1

    def _lend_out(self) -> None:
        """The IO thread parks while the loop is lent; it takes it back once nobody has run it for
        ``_LEND_CHECK_S``, or when asked (IO thread)."""
        lock = self._own_lock
        with lock:
            if self._sleepers:
                return  # someone waits the usual way: keep the loop (and the ask, for a later turn)
            self._lend_asked = False
            self._owner = 0
            self._lent = True
        seen, wait = self._lent_gen, _LEND_CHECK_S
        park = self._park
        while True:
            park.acquire(True, wait)
            lock.acquire()
            if not self._running:
                self._lent = False  # closing: nobody takes it now; a borrower still in it is waited for
                lock.release()
                return
            if self._owner == 0 and (self._give_back or self._lent_gen == seen):
                # Nobody ran the loop since the last look (or asked to hand it back): take it back.
                self._lent = False
                self._give_back = False
                self._io_long = False
                self._owner = self._io_ident
                lock.release()
                return
            self._give_back = False
            if self._owner and self._lent_gen == seen:
                wait = min(wait * 2, _LEND_CHECK_MAX_S)  # one borrower keeps polling: look less often
            else:
                wait = _LEND_CHECK_S
            self._io_long = wait > _LEND_CHECK_S
            seen = self._lent_gen
            lock.release()

    def _end_lending(self) -> None:
        """Closing: no more lending, and no borrower left in the loop before its epoll closes."""
        with self._own_lock:
            self._lent = False
        end = time.monotonic() + 1.0
        while self._owner not in (0, self._io_ident) and time.monotonic() < end:
            self.wake()  # its turn ends, and it sees the mailbox closing
            time.sleep(0.001)

    def _on_wake(self, ev: int) -> None:
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            log.exception("%s: callback failed", self.name)

    def _drain(self, router: zmq.Socket) -> None:
        for _ in range(1000):  # bounded so timers and monitors still get a turn
            try:
                frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            # The role the ZAP handler gave the peer's key (a policy, and reply routing, look at it).
            role = frames[1].get("User-Id")
            rid = frames[0].bytes
            held = self._held.get(rid)
            if held is not None:  # behind a bulk fetch from the same connection: order is kept
                held.append((frames, role))
            else:
                self._receive(rid, frames, role)
        self._redrain = True  # its FD will not say so again: come back without waiting

    def _receive(self, rid: bytes, frames: list[Any], role: str) -> None:
        first = frames[1].buffer
        magic = bytes(first[:4])
        if magic == _PIECE:
            self._piece(rid, frames[2].buffer if len(frames) == 3 else None, role)
        elif rid in self._assembling:
            self._assembling.pop(rid)
            self.stats_dropped += 1
            log.warning("%s: dropped a message sent in pieces: another message came before its last piece", self.name)
            self._receive(rid, frames, role)
        elif magic == _PIECES_HEAD:
            self._pieces_head(rid, frames, role)
        elif magic == bulk.MAGIC:
            self._bulk_in(rid, first, frames[2:], role, lambda: frames[1].get("Peer-Address"))
        else:
            self._deliver(frames[1:], (), role)

    def _pieces_head(self, rid: bytes, frames: list[Any], role: str) -> None:
        """The start of a message sent in pieces: its lengths checked against the limits, then room made."""
        head = frames[1].buffer
        guarded = self._guard_procs and role in PROC_ROLES
        try:
            _, n = _PIECES.unpack_from(head)
            lengths = struct.unpack_from(f"!{n}Q", head, _PIECES.size)
            whole = [f.buffer for f in frames[2:]]
            total = sum(lengths) + sum(_nbytes(f) for f in whole)
            if len(head) != _PIECES.size + 8 * n or not whole or any(x > wire.MAX_FRAME_BYTES for x in lengths):
                raise wire.WireError("a malformed head of a message in pieces")
            if guarded and total > self.proc_frame_limit:
                raise wire.WireError(f"a {total}-byte message from a proc's key is over the "
                                     f"{self.proc_frame_limit}-byte limit for procs")
        except (struct.error, wire.WireError) as e:
            self._dropped(e)
            return
        made = [shm.new_bytes(x)[1] for x in lengths]
        if not self._assembling:
            self._add_timer(time.monotonic() + _ASSEMBLY_STALL_S, self._sweep_assemblies)
        self._assembling[rid] = _Assembly([*whole, *made], made, frames[1].get("Peer-Address"), time.monotonic())
        self._piece(rid, b"", role)  # complete already if there are no bytes to come

    def _piece(self, rid: bytes, piece: Any, role: str) -> None:
        a = self._assembling.get(rid)
        if a is None or piece is None:
            self._assembling.pop(rid, None)
            self.stats_dropped += 1
            log.warning("%s: dropped a piece of a message whose start never came, or a malformed one", self.name)
            return
        data = memoryview(piece).cast("B")
        a.touched = time.monotonic()
        while data.nbytes and a.at < len(a.made):
            dst = a.made[a.at]
            n = min(data.nbytes, dst.nbytes - a.off)
            dst[a.off:a.off + n] = data[:n]
            a.off += n
            data = data[n:]
            if a.off == dst.nbytes:
                a.at, a.off = a.at + 1, 0
        while a.at < len(a.made) and a.made[a.at].nbytes == 0:
            a.at += 1
        if data.nbytes:
            self._assembling.pop(rid)
            self.stats_dropped += 1
            log.warning("%s: dropped a message sent in pieces: more bytes came than its head announced", self.name)
            return
        if a.at == len(a.made):
            del self._assembling[rid]
            body = a.frames
            if bulk.is_descriptor(body[0]):  # a bulk message resent whole (see monarch_agents/bulk.py)
                self._bulk_in(rid, body[0], body[1:], role, lambda: a.peer)
            else:
                self._deliver(body, (), role)

    def _sweep_assemblies(self) -> None:
        """Drop the messages in pieces that stalled (IO thread; runs while there are any)."""
        now = time.monotonic()
        for rid, a in list(self._assembling.items()):
            if now - a.touched > _ASSEMBLY_STALL_S:
                del self._assembling[rid]
                self.stats_dropped += 1
                log.warning("%s: dropped a message sent in pieces: none came for %.0f s", self.name, _ASSEMBLY_STALL_S)
        if self._assembling:
            self._add_timer(now + _ASSEMBLY_STALL_S / 4, self._sweep_assemblies)

    def _bulk_in(self, rid: bytes, head: Any, frames: list[Any], role: str, peer: Callable[[], str]) -> None:
        """A message whose big buffers come by bulk streams: checked as ``_deliver`` would, then fetched."""
        body = [f.buffer if isinstance(f, zmq.Frame) else f for f in frames]
        guarded = self._guard_procs and role in PROC_ROLES
        try:
            desc = bulk.parse(head, len(body), self.proc_frame_limit if guarded else wire.MAX_FRAME_BYTES)
            if desc.inline:
                if desc.tid in self._fetched_ids:
                    return  # we have it: the sender did not hear our acknowledgement
                self._deliver(body, (), role)
                return
            if any(_nbytes(body[i]) for i, _ in desc.big):
                raise bulk.BulkError("a bulk frame's place in the message is not empty")
            size = wire.frames_size(body) + sum(n for _, n in desc.big)
            if guarded and size > self.proc_frame_limit:
                raise bulk.BulkError(f"a {size}-byte message from a proc's key is over the "
                                     f"{self.proc_frame_limit}-byte limit for procs")
            if guarded or self._admit is not None:
                cls = wire.message_type(body)
                if self._admit is not None and not self._admit(cls, role):
                    self.stats_refused += 1
                    log.warning("%s: refused a %s from a peer with the %s key", self.name, cls.__name__, role or "no")
                    return
            host = peer()
        except (bulk.BulkError, wire.WireError, zmq.ZMQError) as e:
            self.stats_dropped += 1
            log.warning("%s: dropped a malformed bulk message: %s", self.name, e)
            return
        dsts = []
        for i, n in desc.big:
            _, view = shm.new_bytes(n)
            body[i] = view
            dsts.append(view)
        self._held[rid] = []
        threading.Thread(target=self._fetch, args=(rid, desc, host, body, dsts, role), name=f"{self.name}-bulk-in",
                         daemon=True).start()

    def _fetch(self, rid: bytes, desc: bulk.Descriptor, host: str, body: list[Any], dsts: list[memoryview],
               role: str) -> None:
        """A bulk fetch's thread: it ends with the fetch (by ``bulk.STALL_S`` without progress)."""
        try:
            self._inbox.fetch(desc, host, dsts)
        except bulk.BulkError as e:
            log.warning("%s: a bulk fetch from %s failed: %s", self.name, host, e)
            body = []
        self.call_soon(lambda: self._fetched(rid, desc, body, role))

    def _fetched(self, rid: bytes, desc: bulk.Descriptor, body: list[Any], role: str) -> None:
        if body:
            self._fetched_ids[desc.tid] = None
            if len(self._fetched_ids) > 1024:
                del self._fetched_ids[next(iter(self._fetched_ids))]
            self._deliver(body, (), role)
        held = self._held.pop(rid, [])
        for k, (frames, r) in enumerate(held):
            self._receive(rid, frames, r)
            if rid in self._held:  # another bulk message: the rest waits behind it too
                self._held[rid].extend(held[k + 1:])
                return

    def _deliver_batch(self, messages: list, role: str) -> None:
        """Messages that came in one read, with no policy to apply: all decoded, then all handled, in
        order.  Handling one can wake another thread (an actor's, a waiting caller's), which then
        waits for the GIL while this one decodes the next; decoding first hands over once."""
        decoded = []
        for frames, fds in messages:
            if fds:
                decoded.append((frames, fds))  # descriptors: the usual path, in its turn
                continue
            try:
                decoded.append(wire.decode(frames))
            except wire.WireError as e:
                self._dropped(e)
        for msg in decoded:
            if type(msg) is tuple:
                self._deliver(msg[0], msg[1], role)
                continue
            self._handle(msg, role)

    def _deliver(self, frames: Any, fds: Any, role: str) -> None:
        # A proc's key (any rank or actor holds one) is held to less than the client's: at a host
        # agent its message's type is checked against the policy, and its size against the procs'
        # limit, before the body is decoded, and the body's pickle is checked before the unpickler
        # sees it (no length or memo index in it may make us allocate more than it is).  A runtime
        # with a policy (a host agent, a `monarch` command's) checks the type before decoding too.
        guarded = self._guard_procs and role in PROC_ROLES
        if not fds and not guarded and self._admit is None:
            # The hot path (a call, an answer): nothing to check before decoding, no descriptors.
            try:
                msg = wire.decode(frames)
            except wire.WireError as e:
                self._dropped(e)
                return
            self._handle(msg, role)
            return
        cls = None
        fds = list(fds)
        try:
            if guarded or self._admit is not None:
                cls = wire.message_type(frames)
            if guarded and wire.frames_size(frames) > self.proc_frame_limit:
                raise wire.WireError(f"a {wire.frames_size(frames)}-byte message from a proc's key is over the "
                                     f"{self.proc_frame_limit}-byte limit for procs")
            if self._admit is not None and not self._admit(cls, role):
                self.stats_refused += 1
                log.warning("%s: refused a %s from a peer with the %s key", self.name, cls.__name__, role or "no")
                if wire.frames_size(frames) <= _REFUSED_DECODE_MAX:  # small: say why to its sender
                    fds, taken = [], fds
                    msg = wire.decode(frames, taken, check=True)
                    self._guard(lambda: self._on_refused(msg, role))
                return
            fds, taken = [], fds
            msg = wire.decode(frames, taken, check=guarded)
            if cls is not None and type(msg) is not cls:
                raise wire.WireError(f"the header says {cls.__name__}, the body is a {type(msg).__name__}")
        except wire.WireError as e:
            self._dropped(e)
            return
        finally:
            for fd in fds:  # not handed to the decoder: ours to close
                os.close(fd)
        self._handle(msg, role)

    def _dropped(self, e: Exception) -> None:
        self.stats_dropped += 1
        log.warning("%s: dropped a malformed message: %s", self.name, e)

    def _handle(self, msg: Any, role: str) -> None:
        """A decoded message to its handler (the one place every path of :meth:`_deliver` ends)."""
        self.stats_received += 1
        self.sender_role = role
        try:
            self.on_message(msg)
        except Exception:
            log.exception("%s: handler failed for %s", self.name, type(msg).__name__)

    # -- same-host links (IO thread) ----------------------------------------------

    def _accept(self, listener: ipc.Listener) -> None:
        links, refused = listener.accept()
        if refused:
            log.warning("%s: refused %d connection(s) from another user", self.name, refused)
        for link in links:
            self._add_link(link)

    def _add_link(self, link: ipc.Link) -> None:
        if link.closed:
            return
        self._links[link.fd] = link
        self._watch(link.fd, select.EPOLLIN, lambda ev: self._link_event(link, ev))
        if link.pending and link.ready:
            self._watch_writable(link)

    def _watch_writable(self, link: ipc.Link) -> None:
        if self._links.get(link.fd) is link and not link.closed:
            self._epoll.modify(link.fd, select.EPOLLIN | select.EPOLLOUT)

    def _link_event(self, link: ipc.Link, ev: int) -> None:
        try:
            if ev & select.EPOLLOUT and not link.flush():
                self._epoll.modify(link.fd, select.EPOLLIN)
            if ev & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP):
                was_ready = link.ready
                messages, eof = link.receive()
                if len(messages) > 1 and not self._guard_procs and self._admit is None:
                    self._deliver_batch(messages, link.role)
                else:
                    for frames, fds in messages:
                        self._deliver(frames, fds, link.role)
                if link.ready and not was_ready and link.outbound and link.flush():
                    self._watch_writable(link)
                if eof:
                    self._link_lost(link, "")
        except ipc.LinkError as e:
            log.warning("%s: closed a link: %s", self.name, e)
            self._link_lost(link, str(e))
        except (ipc.PeerGone, OSError):
            self._link_lost(link, "")

    def _link_lost(self, link: ipc.Link, why: str) -> None:
        """An outbound link's end is its peer's death (or refusal); an inbound one's means nothing."""
        self._drop_link(link)
        addr = link.addr
        if not link.outbound or self._peers.get(addr) is not link:
            return
        with self._peers_lock:
            self._peers.pop(addr, None)
        if addr not in self.dead:
            self.dead.add(addr)
            self._guard(lambda: self.on_peer_lost(addr))

    def _drop_link(self, link: ipc.Link) -> None:
        if self._links.get(link.fd) is link:
            del self._links[link.fd]
            self._unwatch(link.fd)
        link.close()

    def _monitor_event(self, mon: zmq.Socket, addr: str) -> None:
        while True:
            try:
                event = _monitor_event(mon.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            p = self._peers.get(addr) if addr else None
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and p is not None:
                p.connected = True
            elif event & _HANDSHAKE_FAILED and p is not None:
                p.refused = True
            elif event == zmq.EVENT_DISCONNECTED and addr and p is not None and p.connected:
                if addr not in self.dead:
                    self.dead.add(addr)
                    self._guard(lambda: self.on_peer_lost(addr))
                self._close_peer(addr)
                return  # its monitor is closed now

    def _shed_strangers(self, accepted: zmq.Socket) -> None:
        """Shut the connections just accepted whose other end is another local user's socket.

        ZeroMQ owns their descriptors; a duplicate's ``shutdown`` ends the connection for ZeroMQ too
        (it reads EOF and closes its own).  A descriptor is checked by its socket's inode, and the
        inode again on the duplicate, so a number reused meanwhile for something else is left alone.
        Read until none is left (ZeroMQ's descriptor says "look again" once), in batches that each
        read the kernel's tables once.
        """
        more = True
        while more:
            inodes: dict[int, int] = {}
            while len(inodes) < 1000:
                try:
                    frames = accepted.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:  # Again: none left (or the monitor is closing)
                    more = False
                    break
                event, fd = struct.unpack("=hi", frames[0][:6])
                try:
                    st = os.fstat(fd)
                except OSError:
                    continue  # already closed by ZeroMQ
                if event == zmq.EVENT_ACCEPTED and stat.S_ISSOCK(st.st_mode):
                    inodes[fd] = st.st_ino
            shut = strangers(set(inodes.values())) if inodes else set()
            before = self.stats_strangers
            for fd, ino in inodes.items():
                if ino in shut and _shut_if(fd, ino):
                    self.stats_strangers += 1
            if self.stats_strangers > before and (before == 0 or before // 1000 != self.stats_strangers // 1000):
                log.warning("%s: shut %d connection(s) from another user's process, before any handshake",
                            self.name, self.stats_strangers)

    def statistics(self) -> dict:
        return {"received": self.stats_received, "dropped": self.stats_dropped, "refused": self.stats_refused,
                "strangers": self.stats_strangers,
                "peers": len(self._peers)}


_fd_limit_raised = False


def _shut_if(fd: int, inode: int) -> bool:
    """Shut down the connection at ``fd`` (another's descriptor) if it is still the socket ``inode``."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(dup).st_ino != inode:
            return False
        s = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return False
    with s:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
    return True


def raise_fd_limit() -> None:
    """Raise this process's soft limit on open descriptors to its hard limit (once).

    The usual soft limit (1,024) is what an unauthenticated flood of idle connections exhausts
    first: a listener then cannot accept its own job's peers, nor open files.  The hard limit is
    the administrator's; going up to it needs no privilege.  The limit it had is kept in
    ``MONARCH_NOFILE_SOFT`` for the commands the agents start (``zygote._restore_fd_limit``).
    """
    global _fd_limit_raised
    if _fd_limit_raised:
        return
    _fd_limit_raised = True
    import resource

    # Here, not at the top: zygote imports ctypes (~2 ms), and a Unix-socket-only process never raises the limit.
    from monarch_agents.zygote import NOFILE_ENV

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < want:
            # What the user had, for the commands started below us (the zygote gives it back to
            # them): a program using select() breaks with descriptors above 1,024.  The first
            # process of the tree to raise it sets this; those below inherit it.
            os.environ.setdefault(NOFILE_ENV, str(soft))
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError) as e:
        log.debug("could not raise the descriptor limit: %s", e)


def _close_quietly(sock: zmq.Socket, monitor: zmq.Socket) -> None:
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(0)
    sock.close(0)


@dataclass
class _Assembly:
    """A message arriving in pieces: its frames (the whole ones, then those being filled)."""

    frames: list[Any]
    made: list[memoryview]
    peer: str
    touched: float  # when the last piece came (time.monotonic())
    at: int = 0  # which of ``made`` the next bytes go to
    off: int = 0


def _pieces(frames: list[Any]) -> list[list[Any]]:
    """``frames`` as several ZeroMQ messages of at most _PIECE_BYTES each (slices, not copies): a head
    with the small leading frames whole and the lengths of the rest, then those in order, in pieces."""
    k = 0
    while k < len(frames) and _nbytes(frames[k]) < _COPY_THRESHOLD and k < 2:
        k += 1
    k = max(k, 1)
    rest = [memoryview(f).cast("B") for f in frames[k:]]
    head = _PIECES.pack(_PIECES_HEAD, len(rest)) + struct.pack(f"!{len(rest)}Q", *(r.nbytes for r in rest))
    out: list[list[Any]] = [[head, *frames[:k]]]
    for r in rest:
        for off in range(0, r.nbytes, _PIECE_BYTES):
            out.append([_PIECE, r[off:off + _PIECE_BYTES]])
    return out


def _check_length(addr: str, frames: list[Any]) -> None:
    """Refuse a message longer than ``codec_max_frame_length``, as Monarch's channels do (before
    anything of it is sent: the connection stays usable)."""
    length = wire.message_bytes(frames)
    if length >= settings.CHECK_FROM:
        limit = settings.max_frame_length()
        if length > limit:
            raise FrameTooLong(addr, length, limit)


def _nbytes(f: Any) -> int:
    try:
        return memoryview(f).nbytes
    except TypeError:
        return len(f)


def route_ip(peer_host: str, fallback: str | None = "127.0.0.1") -> str:
    """The local IP this host uses to reach ``peer_host`` (binds stay off 0.0.0.0).

    Where there is no route (or the name does not resolve): ``fallback``, or
    OSError when it is None.
    """
    try:
        if ipaddress.ip_address(peer_host).is_loopback:
            return peer_host
    except ValueError:
        pass
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((peer_host, 9))
        return s.getsockname()[0]
    except OSError:
        if fallback is None:
            raise
        return fallback
    finally:
        s.close()
