"""``attach(addr)`` (a client reaching its workers only through one worker loop's address) attacked by
another local user.

The gateway is a duplex connection to the victim's worker, multiplexing every stream the client's
runtime opens and every connection made to the client's port on the worker; in the client, a SOCKS5
proxy on loopback feeds it.  Both are reachable by anyone on the machine: the worker's address
(TCP here) and the proxy's port.  Another user must get neither a stream nor a port through
either: the worker asks for the worker secret before it serves a duplex, the proxy for the job's
relay token; and the owner's own attach still works.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.security.test_worker_attach import _children, worker  # noqa: F401 - the victim's worker fixture

pytestmark = pytest.mark.timeout(300)

#: The victim: attach through the worker, attach it as a host mesh, say where its SOCKS proxy is, wait
#: for a line on stdin (the attacker's turn), then call an actor there.
VICTIM = textwrap.dedent('''
    import sys
    from monarch._src.actor.actor_mesh import attach
    from monarch.actor import Actor, attach_to_workers, endpoint
    from monarch_agents.client import current_route

    class Hi(Actor):
        @endpoint
        def hi(self) -> str:
            return "hi"

    attach(sys.argv[1])
    hosts = attach_to_workers(ca="trust_all_connections", workers=[sys.argv[1]])
    hosts.initialized.get()
    print("SOCKS:", current_route()["socks"].rpartition(":")[2], flush=True)
    sys.stdin.readline()
    print("ANSWER:", hosts.spawn_procs().spawn("hi", Hi).hi.call_one().get(), flush=True)
    hosts.shutdown().get()
''')

#: The attacker: a gateway duplex from the worker without the secret, then streams through the
#: victim's SOCKS proxy without its token (python3 -c ATTACK WORKER_PORT SOCKS_PORT).
ATTACK = textwrap.dedent('''
    import json, os, socket, struct, sys
    worker_port, socks_port = int(sys.argv[1]), int(sys.argv[2])
    # 1. Ask the worker for a duplex in plain JSON, then with a guessed proof.
    s = socket.create_connection(("127.0.0.1", worker_port), timeout=30)
    s.sendall(json.dumps({"gateway": "duplex"}).encode() + b"\\n")
    print("plain duplex ->", s.makefile("rb").readline().decode().strip())
    s.close()
    s = socket.create_connection(("127.0.0.1", worker_port), timeout=30)
    f = s.makefile("rb")
    s.sendall(json.dumps({"monarch_worker": 1, "nonce": os.urandom(32).hex()}).encode() + b"\\n")
    f.readline()
    s.sendall(json.dumps({"proof": os.urandom(32).hex(), "box": os.urandom(64).hex()}).encode() + b"\\n")
    print("guessed proof ->", f.readline().decode().strip())
    # Frames as a duplex would carry them (LISTEN on stream 1): the connection is closed instead.
    try:
        s.sendall(struct.pack("!IBI", 1, 5, 2) + b"{}")
        print("then:", f.readline() == b"")
    except OSError:
        print("then: True")
    # 2. The victim's SOCKS proxy: no authentication, then a guessed token.
    s = socket.create_connection(("127.0.0.1", socks_port), timeout=30)
    s.sendall(b"\\x05\\x01\\x00")
    print("socks without a password ->", s.recv(2).hex())
    s.close()
    s = socket.create_connection(("127.0.0.1", socks_port), timeout=30)
    s.sendall(b"\\x05\\x01\\x02")
    s.recv(2)
    guess = os.urandom(32).hex().encode()
    s.sendall(b"\\x01\\x07monarch" + bytes([len(guess)]) + guess)
    print("socks with a guessed token ->", s.recv(2).hex())
    try:  # a CONNECT after the refusal: the proxy has closed the connection
        s.sendall(b"\\x05\\x01\\x00\\x01\\x7f\\x00\\x00\\x01" + struct.pack("!H", worker_port))
        print("then:", s.recv(10) == b"")
    except OSError:
        print("then: True")
''')


def test_another_user_gets_no_stream_through_a_workers_gateway_nor_a_clients_proxy(attacker, worker, shared,  # noqa: F811
                                                                                     tmp_path):
    p, address, env = worker
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, address], env=env, cwd=tmp_path, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = victim.stdout.readline()
        assert line.startswith("SOCKS: "), line + victim.stderr.read()
        script = os.path.join(shared, "attack_gateway.py")
        with open(script, "w") as f:
            f.write(ATTACK)
        r = attacker.run(f"/usr/bin/python3 {script} {address.rpartition(':')[2]} {line.split()[1]}")
        lines = r.stdout.splitlines()
        assert lines[0].startswith("plain duplex -> ") and "not a monarch worker client" in lines[0], r.stdout
        assert "not authenticated" in lines[1], r.stdout
        assert lines[2] == "then: True", r.stdout
        assert lines[3] == "socks without a password -> 05ff", r.stdout
        assert lines[4] == "socks with a guessed token -> 0101", r.stdout
        assert lines[5] == "then: True", r.stdout
        # The owner's client goes on through its gateway.
        out, err = victim.communicate("go\n", timeout=180)
        assert victim.returncode == 0 and "ANSWER: hi" in out, out + err
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    p.wait(timeout=60)  # the client's shutdown ended the worker loop
    err = (tmp_path / "worker.log").read_text()
    assert "refused a connection: the client did not prove the worker secret" in err, err
