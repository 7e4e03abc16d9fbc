"""``PortForwarder``'s listening port, reached by another local user.

The source address of a forward is a port of the machine (loopback too is reachable by every user of
it), and what it leads to is the job owner's: a notebook, a debugger, a service with no login of its
own.  A connection from another user's process is closed before anything is forwarded; the owner's
are forwarded as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The owner's program: a server that hands whoever connects its secret, forwarded from a port of
#: this process; prints that port, then serves until its stdin closes.
OWNER = textwrap.dedent('''
    import asyncio, socket, sys
    from monarch.actor import this_host, this_proc
    from monarch.job import PortForwarder

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    async def secret(reader, writer):
        writer.write(b"the owner's secret\\n")
        await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(secret, "127.0.0.1", 0)
        procs = this_host().spawn_procs()
        forwarder = this_proc().spawn("forwarder", PortForwarder)
        port = free_port()
        await forwarder.forward.call_one(procs, server.sockets[0].getsockname()[1], this_proc(),
                                         f"127.0.0.1:{port}", wait=60)
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await forwarder.stop()

    asyncio.run(main())
''')

#: Connect and print what came back (run by either user).
GET = ("import socket, sys\n"
       "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=60)\n"
       "got = b''\n"
       "try:\n"
       "    while chunk := s.recv(4096):\n"
       "        got += chunk\n"
       "except ConnectionResetError:\n"
       "    pass\n"
       "print(repr(got))\n")


def test_a_forwarded_port_forwards_nothing_for_another_user(attacker, shared, tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": ROOT})
    try:
        port = owner.stdout.readline().strip()
        assert port.isdigit(), owner.stderr.read() if owner.poll() is not None else port
        script = os.path.join(shared, "get.py")
        with open(script, "w") as f:
            f.write(GET)
        r = attacker.run(f"/usr/bin/python3 {script} {port}")
        assert r.stdout.strip() == "b''", r.stdout  # closed, nothing forwarded
        r = subprocess.run([sys.executable, script, port], capture_output=True, text=True, timeout=120)
        assert r.stdout.strip() == repr(b"the owner's secret\n"), r.stdout + r.stderr
    finally:
        owner.stdin.close()
        try:
            owner.wait(timeout=120)
        finally:
            if owner.poll() is None:
                os.killpg(owner.pid, 9)
                owner.wait()
    err = owner.stderr.read()
    assert "refused 1 connection(s) from another user's process" in err, err
