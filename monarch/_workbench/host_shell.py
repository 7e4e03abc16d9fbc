"""``monarch.job.shell(host_mesh)``: an interactive shell on a real pty of one host of a mesh.

    from monarch.job import ProcessJob, shell
    hosts = ProcessJob({"hosts": 2}).state().hosts
    code = shell(hosts.slice(hosts=1))         # this terminal, until the shell exits

The shell runs under the host's agent (``monarch_agents``' shell service), as ``monarch shell``
does; its exit status is returned (255 if the host agent is lost).  When this side's stdin ends
the shell ends too, with its foreground command (hung up, as Monarch's: 129); when this side's
terminal cannot be written to, the shell is ended and ``shell()`` raises that ``OSError``.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import termios
import tty
from types import SimpleNamespace
from typing import Any


def shell(host_mesh_singleton: Any, *, env: dict[str, str] | None = None, workdir: str | None = None) -> int:
    """Run an interactive shell on a one-host ``HostMesh`` and return its exit status.

    ``env`` adds to the shell's environment; ``workdir`` is where it starts (default: this
    process's working directory).  Keys typed here go to the shell, raw, when stdin is a terminal.
    """
    from monarch_agents.client import current_route
    from monarch._workbench.shell import RemoteShell

    if host_mesh_singleton.size() != 1:
        raise ValueError("shell requires a singleton HostMesh; slice the mesh to one host first")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"env must map names to strings, got {env!r}")
    host = host_mesh_singleton.hosts[0]
    rows, cols = _size()
    shell_env = {"TERM": os.environ.get("TERM", "xterm"), "MONARCH_HOST_RANK": str(host.host_rank), **(env or {})}
    argv = [os.environ.get("SHELL", "/bin/bash"), "-i"]
    out = sys.stdout.fileno()
    sys.stdout.flush()
    rt = host_mesh_singleton._rt()  # the runtime of the mesh's job (a client may talk to several)
    broken: list[OSError] = []

    def copy_out(data: bytes) -> None:
        if broken:
            return
        try:
            while data:
                data = data[os.write(out, data):]
        except OSError as e:
            # This terminal cannot show the shell any more: end the shell, and shell() raises (as Monarch's).
            broken.append(e)
            sh.hang_up()
            sh.done.set()

    sh = RemoteShell(SimpleNamespace(keys=rt.keys, route=current_route(rt)), host, argv, env=shell_env,
                     cwd=workdir or os.getcwd(), rows=rows, cols=cols, on_output=copy_out)
    sh.start()
    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    in_main = _in_main_thread()
    old_winch = signal.signal(signal.SIGWINCH, lambda *_: sh.resize(*_size())) if in_main else None
    try:
        if saved is not None:
            tty.setraw(stdin)
        stdin_open = True
        while not sh.done.is_set():
            if not stdin_open:
                sh.wait(0.1)
                continue
            ready, _, _ = select.select([stdin], [], [], 0.1)
            if ready:
                data = os.read(stdin, 4096)
                if not data:
                    # stdin closed: a Ctrl-D for a shell at its prompt, and the host agent hangs up the
                    # shell and its foreground command unless it ends by itself (Monarch stops them).
                    sh.send(b"\x04")
                    sh.hang_up()
                    stdin_open = False
                    continue
                sh.send(data)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        if in_main:
            signal.signal(signal.SIGWINCH, old_winch)
    if broken:
        raise broken[0]
    code = sh.exit_code if sh.exit_code is not None else 0
    return 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as a shell says


def _size() -> tuple[int, int]:
    s = shutil.get_terminal_size((80, 24))
    return s.lines, s.columns


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
