"""A forwarded TCP connection ends like a TCP connection: a client that drops its connection
abruptly, while the server writes to it faster than it reads, has the server's side dropped too.
(monarch also stops such a server after a few MiB in flight; Monarch buffers what it sends.)  Two source procs on
one host may listen on the same address (connections are spread between them).  A destination
port that is bad for one point fails that forward's call, not the forwarder or the client.  Runs unchanged on
monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import asyncio
import socket

from monarch.actor import ActorError, this_host, this_proc
from monarch.job import PortForwarder

HOST = "127.0.0.1"
CHUNK = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


async def echo(reader, writer) -> None:
    while data := await reader.read(CHUNK):
        writer.write(data)
        await writer.drain()
    writer.close()


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 2})
    forwarder = this_proc().spawn("forwarder", PortForwarder)

    # A server that writes for ever, to a client that never reads and then drops the connection.
    connected, dropped = asyncio.Event(), asyncio.Event()

    async def firehose(reader, writer) -> None:
        connected.set()
        try:
            while True:
                writer.write(b"x" * CHUNK)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
            dropped.set()

    server = await asyncio.start_server(firehose, HOST, 0)
    port = free_port()
    await forwarder.forward.call_one(procs.slice(procs=0), server.sockets[0].getsockname()[1],
                                     procs.slice(procs=1), f"{HOST}:{port}")
    _, writer = await asyncio.open_connection(HOST, port)
    await asyncio.wait_for(connected.wait(), 30)
    await asyncio.sleep(1)
    writer.transport.abort()
    await asyncio.wait_for(dropped.wait(), 30)
    print("a client that drops its connection drops the server's")
    server.close()

    # Both procs listen on one address; eight connections echo through them.
    echo_server = await asyncio.start_server(echo, HOST, 0)
    shared = free_port()
    await forwarder.forward.call_one(procs, echo_server.sockets[0].getsockname()[1], procs, f"{HOST}:{shared}")

    async def round_trip(payload: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(HOST, shared)
        writer.write(payload)
        writer.write_eof()
        got = await reader.read()
        writer.close()
        return got

    payloads = [bytes([i]) * (64 * 1024) for i in range(1, 9)]
    print("two sources on one address echo:", await asyncio.gather(*map(round_trip, payloads)) == payloads)

    # A port that is bad for one point only (a function of the point) fails that forward with an
    # ActorError; neither the forwarder nor this client ends (the default unhandled_fault_hook would
    # end the client on a failed actor), and the sources' ports are free again.
    bad = [free_port(), free_port()]
    echo_port = echo_server.sockets[0].getsockname()[1]
    try:
        await forwarder.forward.call_one(procs, lambda point: echo_port if point["procs"] == 0 else 0,
                                         procs, lambda point: f"{HOST}:{bad[point['procs']]}")
        print("a bad port of one point: no error")
    except ActorError:
        print("a bad port of one point: ActorError")
    for p in bad:
        with socket.socket() as probe:
            probe.bind((HOST, p))
    print("the forwarder still forwards:", await round_trip(b"again") == b"again")

    await forwarder.stop()
    echo_server.close()
    await procs.stop()
    print("done")


asyncio.run(main())
