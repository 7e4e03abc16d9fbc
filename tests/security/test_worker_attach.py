"""Monarch's worker bootstrap (``run_worker_loop_forever`` / ``attach_to_workers``) attacked by another
local user.

The keys of a job used to cross the enrollment connection as plain JSON, and a worker took them from
anyone who connected: another user could start a host agent as the victim (and so run code as
them), listen at the worker's address first and collect the keys, or hold the worker's one
connection slot.  Now both ends prove the user's worker secret (a 0600 file, never sent) before the
keys go, sealed; each attack below fails with one clear line, and the victim's own attach still works.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import wait_gone
from tests.security.conftest import FLOOD, open_sockets

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The victim's client: attach, run an actor on the worker, shut the mesh down; prints what it saw.
CLIENT = textwrap.dedent('''
    import sys
    from monarch.actor import Actor, attach_to_workers, endpoint

    class Hi(Actor):
        @endpoint
        def hi(self) -> str:
            return "hi"

    hosts = attach_to_workers(ca="trust_all_connections", workers=[sys.argv[1]])
    try:
        hosts.initialized.get()
    except Exception as e:
        print("FAILED:", str(e).replace("\\n", " "))
        raise SystemExit(3)
    print("ANSWER:", hosts.spawn_procs().spawn("hi", Hi).hi.call_one().get())
    hosts.shutdown().get()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(secret_file: str) -> dict:
    e = {**os.environ, "PYTHONPATH": ROOT, "MONARCH_WORKER_SECRET_FILE": secret_file}
    e.pop("MONARCH_JOB", None)
    return e


def _client(address: str, env: dict, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLIENT, address], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=180)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out




@pytest.fixture
def worker(tmp_path):
    """A victim's worker loop on loopback TCP, with its secret in a 0600 file (made by the first use)."""
    secret_file = str(tmp_path / "secret" / "worker.key")
    os.makedirs(os.path.dirname(secret_file), mode=0o700)
    env = _env(secret_file)
    # A named secret file is not made for the user (a missing one is an error): write it as they would.
    with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    address = f"tcp://127.0.0.1:{_free_port()}"
    log = open(tmp_path / "worker.log", "w+")
    p = subprocess.Popen([sys.executable, "-c", "from monarch.actor import run_worker_loop_forever; "
                          f"run_worker_loop_forever(ca='trust_all_connections', address={address!r})"],
                         env=env, cwd=tmp_path, stderr=log, start_new_session=True)
    port = int(address.rpartition(":")[2])
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            break
        except ConnectionRefusedError:
            if p.poll() is not None:
                raise AssertionError(f"the worker exited: {(tmp_path / 'worker.log').read_text()}")
            time.sleep(0.05)
    try:
        yield p, address, env
    finally:
        p.kill()
        p.wait()
        log.close()
        assert wait_gone(_children(p.pid) if os.path.exists(f"/proc/{p.pid}/task") else []) == []


HOSTILE_CLIENT = textwrap.dedent('''
    import json, os, socket, sys
    host, port = sys.argv[1], int(sys.argv[2])
    # 1. The old protocol: a job's keys of the attacker's, in plain JSON.
    s = socket.create_connection((host, port), timeout=30)
    s.sendall(json.dumps({"keys": {"server_public": "x"}, "host_rank": 0}).encode() + b"\\n")
    print("plain keys ->", s.makefile("rb").readline().decode().strip())
    s.close()
    # 2. The new hello, then a guessed proof and a box.
    s = socket.create_connection((host, port), timeout=30)
    f = s.makefile("rb")
    s.sendall(json.dumps({"monarch_worker": 1, "nonce": os.urandom(32).hex()}).encode() + b"\\n")
    challenge = json.loads(f.readline())
    print("challenge fields:", sorted(challenge))
    s.sendall(json.dumps({"proof": os.urandom(32).hex(), "box": os.urandom(64).hex()}).encode() + b"\\n")
    print("guessed proof ->", f.readline().decode().strip())
    print("then:", f.readline() == b"")
''')


def test_another_user_cannot_use_a_workers_loop_nor_stop_its_owner_using_it(attacker, worker, shared, tmp_path):
    p, address, env = worker
    port = address.rpartition(":")[2]
    script = os.path.join(shared, "hostile_client.py")
    with open(script, "w") as f:
        f.write(HOSTILE_CLIENT)
    r = attacker.run(f"/usr/bin/python3 {script} 127.0.0.1 {port}")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("plain keys -> ") and "not a monarch worker client" in lines[0], r.stdout
    assert lines[1] == "challenge fields: ['monarch_worker', 'nonce', 'proof']", r.stdout
    assert "not authenticated" in lines[2], r.stdout
    assert lines[3] == "then: True", r.stdout  # closed after the refusal
    assert _children(p.pid) == []  # no host agent was started for either
    # The owner's attach still works, and the worker said in one line each what it refused.
    r = _client(address, env, tmp_path)
    assert r.returncode == 0 and "ANSWER: hi" in r.stdout, r.stdout + r.stderr
    p.wait(timeout=60)  # the client's shutdown ends run_worker_loop_forever, as in Monarch
    err = (tmp_path / "worker.log").read_text()
    assert "refused a connection: the client did not prove the worker secret" in err, err


FAKE_WORKER = textwrap.dedent('''
    import json, os, socket, sys
    if len(sys.argv) > 2:  # an ipc:// worker's socket path, taken first, open to everyone
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ls.bind(sys.argv[2])
        os.chmod(sys.argv[2], 0o777)
        ls.listen(1)
        print(0, flush=True)
    else:
        ls = socket.create_server(("127.0.0.1", 0))
        print(ls.getsockname()[1], flush=True)
    conn, _ = ls.accept()
    conn.settimeout(60)
    got = b""
    f = conn.makefile("rb")
    got += f.readline()
    # Answer as a worker would, without the secret: a nonce and a made-up proof.
    conn.sendall(json.dumps({"monarch_worker": 1, "nonce": os.urandom(32).hex(),
                             "proof": os.urandom(32).hex()}).encode() + b"\\n")
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    with open(sys.argv[1], "wb") as out:
        out.write(got)
''')


def test_a_client_sends_nothing_to_another_users_program_at_the_workers_address(attacker, shared, tmp_path):
    """Another user listens where the victim's worker should be (first, or after it ended)."""
    secret_file = str(tmp_path / "worker.key")
    with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    script, loot = os.path.join(shared, "fake_worker.py"), os.path.join(shared, "loot")
    with open(script, "w") as f:
        f.write(FAKE_WORKER)
    fake = attacker.popen(["/usr/bin/python3", script, loot], stdout=subprocess.PIPE, text=True)
    try:
        port = int(fake.stdout.readline())
        r = _client(f"tcp://127.0.0.1:{port}", _env(secret_file), tmp_path)
        assert fake.wait(timeout=120) == 0
    finally:
        if fake.poll() is None:
            fake.kill()
            fake.wait()
    assert r.returncode == 3, r.stdout + r.stderr
    assert "did not prove it holds your worker secret" in r.stdout and "nothing was sent to it" in r.stdout, r.stdout
    with open(loot, "rb") as f:
        got = f.read()
    # All it got: the client's hello, a nonce (no key, no proof, nothing sealed).
    assert got.count(b"\n") == 1, got
    assert sorted(json.loads(got)) == ["monarch_worker", "nonce"], got


def test_a_worker_secret_another_user_planted_or_could_read_is_refused(attacker, shared, tmp_path):
    """The secret file is where another user could put one they know (a shared folder), or one left
    readable: neither end uses it."""
    planted = os.path.join(shared, "worker.key")
    attacker.run(f"umask 077; echo {'ab' * 32} > {planted}")
    check = "from monarch.actor._worker_auth import load_secret; load_secret()"
    r = subprocess.run([sys.executable, "-c", check], env=_env(planted), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and f"worker secret {planted} belongs to uid {attacker.uid}, not to you" in r.stderr, \
        r.stderr
    mine = str(tmp_path / "open.key")
    with open(mine, "w") as f:
        f.write(os.urandom(32).hex())
    os.chmod(mine, 0o644)
    r = subprocess.run([sys.executable, "-c", check], env=_env(mine), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "is open to others (mode 644)" in r.stderr, r.stderr
    # The attach says so in one line and sends nothing anywhere.
    r = _client("tcp://127.0.0.1:9", _env(mine), tmp_path)
    assert r.returncode == 3 and "attach failed: worker secret" in r.stdout and "open to others" in r.stdout, \
        r.stdout + r.stderr
    # A link to a secret is not followed (it could be swapped under the reader).
    link = str(tmp_path / "link.key")
    os.symlink(planted, link)
    r = subprocess.run([sys.executable, "-c", check], env=_env(link), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "must be a regular file of yours, not a link" in r.stderr, r.stderr




def test_idle_connections_from_another_user_neither_fill_the_worker_nor_keep_its_owner_out(attacker, worker, shared,
                                                                                          tmp_path):
    p, address, env = worker
    port = address.rpartition(":")[2]
    before = open_sockets(p.pid)
    script = os.path.join(shared, "flood.py")
    with open(script, "w") as f:
        f.write(FLOOD)
    flood = attacker.popen(["/usr/bin/python3", script, "127.0.0.1", port, "300"], stdout=subprocess.PIPE, text=True)
    try:
        line = flood.stdout.readline()
        assert line.endswith(" open\n") and int(line.split()[0]) > 16, line
        # While they all stay open, the worker comes to hold at most 16 of them (one more closes the
        # oldest; a closed one's descriptor goes as soon as its thread sees it).
        while open_sockets(p.pid) > before + 16:
            time.sleep(0.1)
        r = _client(address, env, tmp_path)
        assert r.returncode == 0 and "ANSWER: hi" in r.stdout, r.stdout + r.stderr
    finally:
        flood.kill()
        flood.wait()


LOGIN_JOB = textwrap.dedent('''
    import sys
    from monarch._src.job.job import LoginJob, ProcessState

    class Hijacked(LoginJob):
        """Its host's worker address was taken by another user first (a shared folder's socket)."""

        def _start_host(self, host):
            return ProcessState(int(sys.argv[2]), sys.argv[1])

    job = Hijacked()
    job.add_mesh("trainers", ["h0"])
    state = job.state(cached_path=None)
    try:
        state.trainers.initialized.get()
        print("ATTACHED")
    except Exception as e:
        print("FAILED:", str(e).replace("\\n", " "))
''')


def test_a_login_jobs_attach_sends_nothing_to_another_users_socket_at_its_workers_address(attacker, shared,
                                                                                         tmp_path):
    """``LoginJob`` attaches with ``ca="trust_all_connections"`` as Monarch's does; here that is not
    "trust whoever answers": its workers must prove the user's worker secret."""
    secret_file = str(tmp_path / "worker.key")
    with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    script, loot, path = os.path.join(shared, "fake_worker.py"), os.path.join(shared, "loot"), os.path.join(shared, "h0")
    with open(script, "w") as f:
        f.write(FAKE_WORKER)
    fake = attacker.popen(["/usr/bin/python3", script, loot, path], stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout.readline().strip() == "0"
        r = subprocess.run([sys.executable, "-c", LOGIN_JOB, f"ipc://{path}", str(fake.pid)], env=_env(secret_file),
                           cwd=tmp_path, capture_output=True, text=True, timeout=180)
        assert fake.wait(timeout=120) == 0
    finally:
        if fake.poll() is None:
            fake.kill()
            fake.wait()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("FAILED: attach failed") and "did not prove it holds your worker secret" in r.stdout, \
        r.stdout
    with open(loot, "rb") as f:
        got = f.read()
    assert got.count(b"\n") == 1 and sorted(json.loads(got)) == ["monarch_worker", "nonce"], got


def test_a_home_monarch_folder_another_user_can_write_is_not_used_for_the_secret(tmp_path):
    """The default secret is made in ``~/.monarch``; one that others may write (they could put their
    own secret there first) is refused in one line naming it, and the attach sends nothing."""
    home = tmp_path / "home"
    (home / ".monarch").mkdir(parents=True)
    os.chmod(home / ".monarch", 0o777)
    env = {**_env(""), "HOME": str(home)}
    env.pop("MONARCH_WORKER_SECRET_FILE")
    r = _client("tcp://127.0.0.1:9", env, tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"cannot make your worker secret {home}/.monarch/worker.key" in r.stdout, r.stdout
    assert "is writable by others" in r.stdout and not (home / ".monarch" / "worker.key").exists(), r.stdout


#: Run as another user: listen where the victim's client dials, relay both ways to the real worker,
#: and once the worker has answered (its second line), write a shutdown line of its own to it.
RELAY = textwrap.dedent('''
    import socket, sys, threading
    ls = socket.create_server(("127.0.0.1", 0))
    print(ls.getsockname()[1], flush=True)
    client, _ = ls.accept()
    worker = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
    worker.settimeout(None)
    lock = threading.Lock()

    def pipe(src, dst, inject):
        lines = 0
        while data := src.recv(65536):
            with lock:
                dst.sendall(data)
            lines += data.count(b"\\n")
            if inject and lines >= 2:
                inject = False
                with lock:
                    worker.sendall(b"shutdown\\n" + b'{"shutdown": "' + b"00" * 24 + b'"}\\n')
                print("injected", flush=True)
        dst.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=pipe, args=(worker, client, True), daemon=True)
    t.start()
    pipe(client, worker, False)
    t.join()
''')

#: The victim's client through that relay: attach, an actor answers; then (after a line on stdin)
#: it answers again and the mesh is shut down.
TWO_CALLS = textwrap.dedent('''
    import sys
    from monarch.actor import Actor, attach_to_workers, endpoint

    class Hi(Actor):
        @endpoint
        def hi(self) -> str:
            return "hi"

    hosts = attach_to_workers(ca="trust_all_connections", workers=[sys.argv[1]])
    hi = hosts.spawn_procs().spawn("hi", Hi)
    print("FIRST:", hi.hi.call_one().get(), flush=True)
    sys.stdin.readline()
    print("SECOND:", hi.hi.call_one().get(), flush=True)
    hosts.shutdown().get()
''')


def test_a_shutdown_line_written_by_another_user_on_the_way_does_not_end_the_worker(attacker, worker, shared,
                                                                                    tmp_path):
    """Another user relays the victim's enrollment connection (listening at the address the client
    dials) and writes a shutdown line into it: the keys and answer are sealed, and so is the shutdown,
    so the worker ignores it (said once), the victim's job goes on, and its own shutdown still works."""
    p, address, env = worker
    script = os.path.join(shared, "relay.py")
    with open(script, "w") as f:
        f.write(RELAY)
    relay = attacker.popen(["/usr/bin/python3", script, address.rpartition(":")[2]], stdout=subprocess.PIPE,
                           text=True)
    client = None
    try:
        port = int(relay.stdout.readline())
        client = subprocess.Popen([sys.executable, "-c", TWO_CALLS, f"tcp://127.0.0.1:{port}"], env=env, cwd=tmp_path,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = client.stdout.readline()
        assert first == "FIRST: hi\n", (f"worker exit status {p.poll()} (None: running); client: "
                                         + (client.stderr.read() if client.poll() is not None else ""))
        assert relay.stdout.readline() == "injected\n"
        # The worker reads the injected lines: it ends (it used to) or says once that it ignored them.
        log = tmp_path / "worker.log"
        while "ignored a line on a client's connection that is not its sealed shutdown" not in log.read_text():
            assert p.poll() is None, f"the worker ended on another user's shutdown line: {log.read_text()}"
            time.sleep(0.05)
        client.stdin.write("go\n")
        client.stdin.flush()
        out, err = client.communicate(timeout=180)
        assert client.returncode == 0 and out == "SECOND: hi\n", out + err
        assert p.wait(timeout=60) == 0  # the client's own (sealed) shutdown ended the loop
    finally:
        for proc in (client, relay):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    text = (tmp_path / "worker.log").read_text()
    assert text.count("ignored a line on a client's connection that is not its sealed shutdown") == 1, text
