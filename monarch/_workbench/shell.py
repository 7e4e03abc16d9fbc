"""An interactive command on a real pty of one reserved host: the engine behind ``monarch shell``.

    sh = RemoteShell(record, record.hosts[0], ["bash", "-i"], on_output=write_to_terminal)
    sh.start()
    sh.send(b"ls\\n")
    sh.wait()              # True once the shell exited; sh.exit_code says how

Its bytes come back on a port of its own, so any number of shells and runs share
one process.  If its host agent dies, the shell ends with exit code 255.
"""

from __future__ import annotations

import threading
import uuid
from typing import Callable

from monarch_agents import messages as m
from monarch_agents.client import ensure_runtime
from monarch_agents.errors import SupervisionError
from monarch_agents.runtime import Runtime, StreamPort
from monarch.errors import AgentError
from monarch._workbench.state import HostRecord, JobRecord

#: The exit code of a shell whose host agent died (as ssh reports a lost connection).
AGENT_LOST_EXIT = 255


class RemoteShell:
    """``argv`` on a pty of ``host``; ``on_output(bytes)`` gets what it writes (on the IO thread)."""

    def __init__(self, record: JobRecord, host: HostRecord, argv: list[str], *, on_output: Callable[[bytes], None],
                 env: dict[str, str] | None = None, cwd: str | None = None, rows: int = 24, cols: int = 80):
        self.host = host
        self.argv = list(argv)
        self.env = dict(env or {})
        self.cwd = cwd
        self.rows, self.cols = rows, cols
        self.on_output = on_output
        self.shell_id = uuid.uuid4().hex
        self.rt: Runtime = ensure_runtime(record.keys, reach=[host.addr], route=record.route)
        self.exit_code: int | None = None
        self.reason = ""
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._stream: StreamPort | None = None

    def start(self) -> None:
        """Open the shell (its output starts arriving at once); AgentError if its host agent is gone."""
        rt = self.rt
        self._stream = rt.open_stream(self._on_stream, self._agent_lost, [self.host.addr])
        try:
            rt.send(self.host.addr, m.OpenShell(self.shell_id, self.argv, self.env, self.cwd, self.rows, self.cols,
                                                self._stream.ref, rt.addr))
        except SupervisionError as e:
            self._stream.close()
            raise AgentError(f"host agent on {self.host.host} is unreachable: {e}",
                             "`monarch status` checks every agent") from None

    def send(self, data: bytes) -> None:
        """Type ``data`` into the shell (b"\\x04" is Ctrl-D)."""
        self._send(m.ShellData(self.shell_id, data))

    def hang_up(self) -> None:
        """This side's input ended: the shell is to end, with what runs in its foreground (what was
        sent before still reaches it first)."""
        self._send(m.ShellData(self.shell_id, b"", hangup=True))

    def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size."""
        self._send(m.ShellData(self.shell_id, b"", rows, cols))

    def wait(self, timeout: float | None = None) -> bool:
        """True once the shell has exited (``exit_code`` is set)."""
        return self.done.wait(timeout)

    def _send(self, msg: m.ShellData) -> None:
        if self.done.is_set():
            return
        try:
            self.rt.send(self.host.addr, msg)
        except SupervisionError as e:
            self._end(AGENT_LOST_EXIT, f"host agent on {self.host.host} is unreachable ({e})")

    def _on_stream(self, msg: m.ShellOutput | m.RunExited) -> None:
        if type(msg) is m.ShellOutput:
            self.on_output(msg.data)
        elif type(msg) is m.RunExited:
            self._end(msg.exit_code, msg.reason)

    def _agent_lost(self, addr: str, err: SupervisionError) -> None:
        self._end(AGENT_LOST_EXIT, f"host agent on {self.host.host} died ({err})")

    def _end(self, code: int, reason: str) -> None:
        with self._lock:
            if self.exit_code is not None:
                return
            self.exit_code, self.reason = code, reason
            #: The shell ended because its host agent was lost, not by exiting.
            self.agent_lost = code == AGENT_LOST_EXIT and reason.startswith("host agent on ")
        if self._stream is not None:
            self._stream.close()
        self.done.set()
