"""``PortForwarder``: forward TCP ports between proc meshes, as PyTorch Monarch's ``monarch.job.PortForwarder``.

    forwarder = this_proc().spawn("port_forwarder", PortForwarder)
    # connections to 127.0.0.1:9000 here reach 127.0.0.1:8000 on the host of `server_procs`
    forwarder.forward.call_one(server_procs, 8000, this_proc(), "127.0.0.1:9000").get()
    ...
    forwarder.stop().get()          # closes every forward it started

Bytes travel as actor messages between the two procs, so they use the job's authenticated,
encrypted connections: nothing new listens on the network except the source address asked for.
That address is reachable by every user of the machine (loopback too), and what it leads to is the
job owner's (a notebook, a debugger, a dashboard): a connection whose other end is another local
user's socket is closed before anything is forwarded (its uid is the kernel's, ``/proc/net/tcp``).
On loopback a peer whose uid cannot be told is refused too; on another address (asked for, to
reach it from other machines) a peer elsewhere is forwarded, as Monarch's is.

Beyond Monarch: the destination is retried for ``connect_timeout`` seconds per connection (a
server that is still starting is waited for, a bounded time), after which the connection is
closed and the source proc logs why; ``forward(..., wait=S)`` checks every destination accepts
connections within ``S`` seconds and raises a clear error if one does not.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import time
import uuid
from typing import Any, Callable, NamedTuple

from monarch.actor import Actor, Channel, Point, Port, PortReceiver, ProcMesh, current_rank, endpoint
from monarch_agents.unproven import local_peer_uid

log = logging.getLogger("monarch.port_forward")

_LOOPBACK = "127.0.0.1"
_CHUNK = 64 * 1024
_RETRY_S = 0.1
#: Chunks a side may send before the other has written them to its socket (each written chunk is
#: acknowledged): 2 MiB in flight per direction, so a reader that stops reading stops the writer at
#: the other end (as a TCP connection would), and a dropped connection is noticed by a blocked writer.
_WINDOW = 32


class _Data(NamedTuple):
    data: bytes


class _Eof(NamedTuple):
    pass


class _Abort(NamedTuple):
    reason: str


class _Ack(NamedTuple):
    """One chunk of ours was written to the other side's socket: one more may be sent."""


def _check_port(name: str, port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an integer from 1 through 65535, got {port!r}")
    return port


def _parse_address(address: Any) -> tuple[str, int]:
    if not isinstance(address, str):
        raise ValueError(f"src_address must be a string 'address:port', got {address!r}")
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"src_address must use 'address:port' form, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"src_address port must be an integer, got {address!r}") from None
    return host, _check_port("src_address port", port)


async def _pump_out(reader: asyncio.StreamReader, to_peer: Port, window: asyncio.Semaphore) -> None:
    """Socket -> peer: data (at most ``_WINDOW`` chunks not yet written there), then end of stream."""
    while data := await reader.read(_CHUNK):
        await window.acquire()
        to_peer.send(_Data(data))
    to_peer.send(_Eof())


async def _pump_in(from_peer: PortReceiver, writer: asyncio.StreamWriter, to_peer: Port,
                   window: asyncio.Semaphore, out: "asyncio.Future[None]") -> None:
    """Peer -> socket, until the peer's end of stream (or abort); acknowledges each chunk once
    written, and takes the peer's acknowledgements of ours (after its end of stream too, for as
    long as ``out``, our direction, still sends)."""
    while True:
        msg = await from_peer.recv()
        if isinstance(msg, _Ack):
            window.release()
        elif isinstance(msg, _Data):
            writer.write(msg.data)
            await writer.drain()
            to_peer.send(_Ack())
        elif isinstance(msg, _Eof):
            if writer.can_write_eof():
                writer.write_eof()
                await writer.drain()
            break
        else:
            raise ConnectionAbortedError(getattr(msg, "reason", "the other side aborted"))
    while not out.done():
        recv = asyncio.ensure_future(from_peer.recv())
        done, _ = await asyncio.wait({recv, out}, return_when=asyncio.FIRST_COMPLETED)
        if recv not in done:
            recv.cancel()
            return
        msg = recv.result()
        if isinstance(msg, _Ack):
            window.release()
        elif isinstance(msg, _Abort):
            raise ConnectionAbortedError(msg.reason)


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, to_peer: Port,
                 from_peer: PortReceiver) -> None:
    """Both directions until both ends closed; either failing aborts the connection on both sides."""
    window = asyncio.Semaphore(_WINDOW)
    out = asyncio.ensure_future(_pump_out(reader, to_peer, window))
    inn = asyncio.ensure_future(_pump_in(from_peer, writer, to_peer, window, out))
    try:
        await asyncio.gather(out, inn)
    except BaseException as e:
        try:
            to_peer.send(_Abort(f"{type(e).__name__}: {e}"))
        except Exception as e2:
            # The peer is already gone: it has nothing left to abort.
            log.debug("abort not sent to the other side: %s", e2)
        writer.transport.abort()
        if not isinstance(e, Exception):
            raise
    finally:
        for t in (out, inn):
            t.cancel()
        await asyncio.gather(out, inn, return_exceptions=True)
        writer.close()


class _Relays:
    """The relay tasks of one actor, cancelled together when it stops."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()

    def start(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _connect(port: int, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the loopback port, retrying while nothing listens, for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncio.open_connection(_LOOPBACK, port)
        except OSError as e:
            if time.monotonic() >= deadline:
                import socket

                host = os.environ.get("MONARCH_HOSTNAME") or socket.gethostname()
                raise ConnectionRefusedError(f"nothing listens on {_LOOPBACK}:{port} on host {host} "
                                             f"(waited {timeout:g} s): {e.strerror or e}") from None
            await asyncio.sleep(_RETRY_S)


class _Destination(Actor):
    """On a destination proc: opens a connection to its loopback port for each forwarded connection."""

    def __init__(self, connect_timeout: float):
        self.port = 0
        self.connect_timeout = connect_timeout
        self.relays = _Relays()

    @endpoint
    async def configure(self, dst_port: Any) -> None:
        # Checked in an endpoint, not in __init__: a bad port of one point is then that call's
        # ActorError, not a failed actor whose supervision event would end the forwarder (and,
        # unhandled, the client), as in Monarch.
        self.port = _check_port("dst_port", dst_port(current_rank()) if callable(dst_port) else dst_port)

    @endpoint
    async def probe(self, wait: float) -> None:
        _, writer = await _connect(self.port, wait)
        writer.close()

    @endpoint
    async def open(self, to_source: Port) -> Port:
        reader, writer = await _connect(self.port, self.connect_timeout)
        to_me, from_source = Channel.open()
        self.relays.start(_relay(reader, writer, to_source, from_source))
        return to_me

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self.relays.close()


class _Source(Actor):
    """On a source proc: listens on its address and relays each connection to its destination proc."""

    def __init__(self) -> None:
        self.server: asyncio.AbstractServer | None = None
        self.destination: Any = None
        self.relays = _Relays()
        self.where = ""
        self.refused = 0

    @endpoint
    async def start(self, destination: Any, src_address: Any) -> str:
        point = current_rank()
        self.destination = destination.slice(**{k: point[k] for k in point}) if len(point) else destination
        address = src_address(point) if callable(src_address) else src_address
        host, port = _parse_address(address)
        self.server = await asyncio.start_server(self._accept, host, port, reuse_address=True, reuse_port=True)
        self.where = f"{host}:{self.server.sockets[0].getsockname()[1]}"
        return self.where

    def _admits(self, writer: asyncio.StreamWriter) -> bool:
        """Only the owner's processes, or (off loopback) peers on other machines, are forwarded."""
        sock = writer.get_extra_info("socket")
        uid = local_peer_uid(sock) if sock is not None else None
        if uid is not None:
            return uid == os.getuid()
        try:
            return not ipaddress.ip_address(sock.getsockname()[0].split("%")[0]).is_loopback
        except (AttributeError, OSError, ValueError):
            return False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admits(writer):
            self.refused += 1
            if self.refused == 1 or self.refused % 100 == 0:  # one line, not one per connection of a flood
                log.warning("port forward %s: refused %d connection(s) from another user's process",
                            self.where, self.refused)
            writer.transport.abort()
            return
        to_me, from_destination = Channel.open()
        try:
            to_destination = await self.destination.open.call_one(to_me)
        except Exception as e:
            log.error("port forward %s: %s", self.where, getattr(e, "message", None) or e)
            writer.transport.abort()
            return
        self.relays.start(_relay(reader, writer, to_destination, from_destination))

    async def __cleanup__(self, exc: Exception | None) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        await self.relays.close()


class PortForwarder(Actor):
    """Owns TCP port forwards between proc meshes; stopping it closes every forward it started.

    Spawn one (``this_proc().spawn("port_forwarder", PortForwarder)``) and call
    :meth:`forward` once per forward.
    """

    @endpoint
    async def forward(self, dst_proc_mesh: ProcMesh, dst_port: int | Callable[[Point], int],
                      src_proc_mesh: ProcMesh, src_address: str | Callable[[Point], str], *,
                      connect_timeout: float | None = None, wait: float | None = None) -> None:
        """Forward connections to ``src_address`` on each source proc to ``127.0.0.1:dst_port`` on the
        destination proc at the same point.

        The meshes must have the same shape; ``dst_port`` and ``src_address`` (``"address:port"``)
        may be functions of the point.  ``connect_timeout``: how long one connection waits for its
        destination to accept (default: ``monarch.config``'s ``port_forward_connect_timeout``, 10 s); ``wait``: if given, first check every destination accepts within
        that many seconds (``ConnectionRefusedError`` naming the port and host otherwise).
        """
        if dst_proc_mesh.extent != src_proc_mesh.extent:
            raise ValueError("destination and source process meshes must have the same shape: "
                             f"{dst_proc_mesh.extent} != {src_proc_mesh.extent}")
        if not callable(dst_port):
            _check_port("dst_port", dst_port)
        if not callable(src_address):
            _parse_address(src_address)
        if connect_timeout is None:
            from monarch import config

            connect_timeout = config.seconds("port_forward_connect_timeout")
        if not (isinstance(connect_timeout, (int, float)) and connect_timeout >= 0):
            raise ValueError(f"connect_timeout must be a number of seconds >= 0, got {connect_timeout!r}")
        suffix = uuid.uuid4().hex[:12]
        destination = source = None
        try:
            destination = dst_proc_mesh.spawn(f"port_forward_destination_{suffix}", _Destination,
                                              float(connect_timeout))
            await destination.configure.call(dst_port)
            if wait is not None:
                await destination.probe.call(float(wait))
            source = src_proc_mesh.spawn(f"port_forward_source_{suffix}", _Source)
            await source.start.call(destination, src_address)
        except BaseException:
            for mesh in (source, destination):
                if mesh is not None:
                    try:
                        await mesh.stop()
                    except Exception as e:
                        # Cleanup after a failed start: the start's own error is the one to raise.
                        log.debug("port forward cleanup: stopping %s failed: %s", mesh, e)
            raise


__all__ = ["PortForwarder"]
