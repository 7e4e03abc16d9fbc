"""Interactive shells for ``monarch shell``: a command on a real pty, bytes both ways.

``OpenShell`` starts the command on a new pty; what it writes goes to the reply
port as ``ShellOutput``, keys come back as ``ShellData`` (with the window size
when it changed), and one ``RunExited`` says how the shell ended.  Nothing is
logged: a shell is the user's terminal.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import termios
import threading
import time
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents.services import Service, stop_children
from monarch_agents.services.runs import CommandChild

#: How long a shell gets between SIGTERM (SIGHUP first: its terminal is going) and SIGKILL.
_KILL_GRACE_S = 1.0


class _Shell(CommandChild):
    def __init__(self, service: "ShellsService", msg: m.OpenShell, master: int):
        super().__init__("shell", service, msg.shell_id, 0, msg.reply, list(msg.argv), msg.owner)
        self.master = master
        #: Held while the pty is written or closed (a write may block while the shell reads nothing).
        self.fd_lock = threading.Lock()


class ShellsService(Service):
    """The open shells on this host."""

    name = "shells"

    def __init__(self, agent: Any):
        super().__init__(agent)
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.shells: dict[str, _Shell] = {}

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {m.OpenShell: self.on_open_shell, m.ShellData: self.on_shell_data}

    def info(self) -> dict:
        with self.lock:
            return {"shells": len(self.shells)}

    def stop(self, deadline: float) -> None:
        with self.lock:
            shells = list(self.shells.values())
        stop_children(self.agent, shells, deadline, _KILL_GRACE_S)
        with self.done:
            self.done.wait_for(lambda: not self.shells, max(0.0, deadline - time.monotonic()))

    def finished(self, shell: CommandChild) -> None:
        with self.done:
            if self.shells.get(shell.run_id) is shell:
                del self.shells[shell.run_id]
            self.done.notify_all()

    def on_open_shell(self, msg: m.OpenShell) -> None:
        agent = self.agent
        agent.track_owner(msg.owner)
        master, slave = pty.openpty()
        _set_winsize(master, msg.rows, msg.cols)
        shell = _Shell(self, msg, master)
        with self.lock:
            self.shells[msg.shell_id] = shell
        cwd, env = agent.place_child(msg.cwd, agent.child_env(msg.env))
        try:
            agent.start_child({"kind": "exec", "argv": list(msg.argv), "env": env, "cwd": cwd, "pty": True},
                              [slave, slave, slave], shell)
        finally:
            os.close(slave)
        threading.Thread(target=self._pump, args=(shell,), name=f"pty-{msg.shell_id[:8]}", daemon=True).start()

    def _pump(self, shell: _Shell) -> None:
        while True:
            try:
                data = os.read(shell.master, 65536)
            except OSError:
                data = b""  # EIO: the pty's last user closed it
            if not data:
                break
            self.agent.send(shell.reply.addr, m.ShellOutput(shell.reply.port_id, shell.run_id, data))
        with shell.fd_lock:
            master, shell.master = shell.master, -1
            os.close(master)
        shell.pumped()

    def on_shell_data(self, msg: m.ShellData) -> None:
        with self.lock:
            shell = self.shells.get(msg.shell_id)
        if shell is None:
            return
        with shell.fd_lock:  # the pump closes the fd (and its number may be reused) under it
            master = shell.master
            if master >= 0:
                if msg.rows and msg.cols:
                    _set_winsize(master, msg.rows, msg.cols)
                if msg.data:
                    try:
                        os.write(master, msg.data)
                    except OSError:
                        pass


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    if rows and cols:
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        except OSError:
            pass
