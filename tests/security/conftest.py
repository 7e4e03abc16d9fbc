"""A second local user, for tests that attack a reservation as another account on a shared machine would.

CI runs as root: the session makes a throwaway user with ``useradd`` (no home, no password) and
removes it at the end; :meth:`Attacker.run` runs a shell command as that user (``runuser``).
Shared places are made 1777 as ``/tmp`` is (sticky, writable by all), so the attacker can reach
them; the victim's commands get ``TMPDIR`` pointing at one, never the machine's own ``/tmp``,
so that what an attacker makes there cannot touch other runs on this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import uuid
from dataclasses import dataclass

import pytest


RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
_ATTACKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/"}


@dataclass
class Attacker:
    name: str
    uid: int

    def run(self, script: str, *, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """Run ``script`` with ``sh -c`` as the attacker (plain ``/usr/bin/python3`` is theirs to use too)."""
        r = subprocess.run([RUNUSER, "-u", self.name, "--", "sh", "-c", script], capture_output=True, text=True,
                           timeout=timeout, env=_ATTACKER_ENV, cwd="/", **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"as {self.name}: {script!r} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen([RUNUSER, "-u", self.name, "--", *argv], env=_ATTACKER_ENV,
                                cwd="/", **kw)


@pytest.fixture(scope="session")
def attacker():
    if os.getuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("needs root with useradd and runuser (as in CI) to make a second local user")
    name = f"mnatk{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        uid = int(subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout)
        yield Attacker(name, uid)
    finally:
        # Whatever the attacker still runs goes first, or userdel refuses.
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "-f", name], capture_output=True)


@pytest.fixture
def shared(tmp_path_factory):
    """A folder every user may write, as ``/tmp`` is (sticky), outside the 0700 pytest temp folders."""
    d = f"/tmp/monarch-shared-{uuid.uuid4().hex[:10]}"
    os.mkdir(d)
    os.chmod(d, 0o1777)
    yield d
    subprocess.run(["rm", "-rf", d], capture_output=True)


#: Run as another user: ``python3 -c FLOOD HOST PORT N [trickle]`` opens N connections and holds them
#: silent for 120 s (``trickle``: a SOCKS5 greeting naming 255 methods, then one byte every 3 s).
FLOOD = textwrap.dedent('''
    import socket, sys, time
    socks = []
    for _ in range(int(sys.argv[3])):
        try:
            socks.append(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5))
        except OSError as e:
            print("connect failed:", e, flush=True)
            break
    print(len(socks), "open", flush=True)
    if sys.argv[4:] == ["trickle"]:  # a SOCKS5 greeting naming 255 methods, then one byte every 3 s
        for s in socks:
            s.sendall(bytes([5, 255]))
        for _ in range(40):
            time.sleep(3)
            for s in socks:
                try:
                    s.sendall(bytes([0]))
                except OSError:
                    pass
    time.sleep(120)
''')


def open_sockets(pid: int) -> int:
    """How many sockets process ``pid`` holds open."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n
