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
import signal
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
#: After the client's EOF, how long a shell at its prompt with no input left may take to exit by itself.
_EOF_IDLE_S = 2.0
_EOF_POLL_S = 0.05


class _Shell(CommandChild):
    def __init__(self, service: "ShellsService", msg: m.OpenShell, master: int):
        super().__init__("shell", service, msg.shell_id, 0, msg.reply, list(msg.argv), msg.owner)
        self.master = master
        #: Held while the pty is written or closed (a write may block while the shell reads nothing).
        self.fd_lock = threading.Lock()
        #: The pty's terminal (read: how much typed input the shell has not read yet).
        self.tty_name = ""
        self.hung_up = False


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
        shell.tty_name = os.ttyname(slave)
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
        if msg.hangup and not shell.hung_up:
            shell.hung_up = True
            threading.Thread(target=self.hang_up_on_eof, args=(shell,), name=f"eof-{msg.shell_id[:8]}",
                             daemon=True).start()

    def hang_up_on_eof(self, shell: _Shell) -> None:
        """The client's input ended: end the shell and what runs in its foreground, as Monarch's does.

        What the client typed before its EOF (and the Ctrl-D it sends with it) is still read by
        the shell: a script piped in runs to its ``exit``.  But a foreground command the shell
        waits for (``sleep 300``: it reads no Ctrl-D) is hung up, and so is a shell that sits at
        its prompt with nothing left to read: SIGHUP to the foreground group and the shell's own
        (their terminal is gone), then SIGTERM and SIGKILL to what is left.
        """
        idle_since: float | None = None
        while shell.exited is None:
            with shell.fd_lock:
                if shell.master < 0:
                    return  # the pty is closed: the shell has gone
                try:
                    foreground = os.tcgetpgrp(shell.master)
                except OSError:
                    return
            try:
                own = os.getpgid(shell.pid) if shell.pid else 0
            except ProcessLookupError:
                return
            if own and foreground != own:
                break  # a command runs in the foreground: nothing will read the Ctrl-D
            if _unread_input(shell.tty_name) == 0:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= _EOF_IDLE_S:
                    break  # at its prompt, with nothing left to read, and it has not exited
            else:
                idle_since = None
            time.sleep(_EOF_POLL_S)
        else:
            return
        groups = {g for g in (foreground, own) if g and g > 1 and g != os.getpgrp()}
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGKILL):
            for g in groups:
                try:
                    os.killpg(g, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + _KILL_GRACE_S
            while shell.exited is None and time.monotonic() < deadline:
                time.sleep(_EOF_POLL_S)
            if shell.exited is not None:
                return


def _unread_input(tty_name: str) -> int:
    """Bytes typed into the pty that its reader has not read yet (0 if it cannot be told)."""
    try:
        fd = os.open(tty_name, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCINQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0
    finally:
        os.close(fd)


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    if rows and cols:
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        except OSError:
            pass
