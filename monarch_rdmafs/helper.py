"""One helper process of ours: start it, wait until it says it is ready, stop it by a deadline.

The FUSE mounts (:mod:`monarch_rdmafs.mount`, ``monarch.gather_mount``), a client's private host
agent (``monarch.actor``) and the user's shared host agent (``monarch_agents.local_agent``, which
outlives its starter: :meth:`HelperProcess.detach`) are each a child process that is handed its configuration on stdin (keys
never go on a command line, where ``ps`` shows them), says one line when it is ready (on stdout or
on a pipe of its own), and ends when its stdin closes; a child that does not end by the deadline is
killed.  It lives in the lowest layer so that all three can use it.

    helper = HelperProcess([sys.executable, "-m", "x"], name="the mount")
    helper.start(config_line)
    if helper.wait_ready(10.0) != "ready": ...
    helper.stop(time.monotonic() + 5.0)
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from typing import Any, Callable, Protocol


class HelperProcess:
    """A child process with a line protocol: ``start``, ``wait_ready``/``read_line``, ``stop(deadline)``.

    ``ready_fd_flag``: the child says its lines on a pipe of its own, whose fd follows this flag on
    its command line (``--info-fd 7``); without it, on its stdout.  Lines are read with ``select``
    on the pipe, so a child that never answers costs no thread.  ``stdout`` (with ``ready_fd_flag``
    only: otherwise stdout is the protocol's pipe), ``stderr`` and ``cwd`` are Popen's.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, ready_fd_flag: str | None = None,
                 stdout: int | None = None, stderr: int | None = None, cwd: str | None = None,
                 spawn: "Spawn | None" = None):
        """``spawn``: starts the child instead of ``subprocess.Popen`` (a host agent's zygote forks a
        warm one: see :data:`Spawn`); only with the stdout protocol, ``env`` and ``cwd`` left out."""
        if stdout is not None and not ready_fd_flag:
            raise ValueError("stdout is the helper's line protocol unless it answers on a pipe of its own")
        if spawn is not None and (ready_fd_flag or env is not None or cwd is not None):
            raise ValueError("a spawned helper answers on its stdout and keeps its spawner's environment")
        self.spawn = spawn
        self.argv = list(argv)
        self.env = env
        self.ready_fd_flag = ready_fd_flag
        self.stdout = stdout
        self.stderr = stderr
        self.cwd = cwd
        self.proc: subprocess.Popen | _Spawned | None = None
        self._fd = -1
        self._buf = b""
        #: The child closed its end of the pipe (it exited, or is exiting): no line will come.
        self.eof = False

    def start(self, config: bytes | None = None, *, keep_stdin: bool = True) -> None:
        """Start the child in a session of its own; ``config`` is written to its stdin, which then
        stays open (the child ends when it closes) unless ``keep_stdin`` is False."""
        if self.spawn is not None:
            self._start_spawned(config, keep_stdin)
            return
        argv, w = self.argv, -1
        pass_fds: tuple[int, ...] = ()
        if self.ready_fd_flag:
            self._fd, w = os.pipe()
            argv, pass_fds = [*argv, self.ready_fd_flag, str(w)], (w,)
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                         stdout=self.stdout if self.ready_fd_flag else subprocess.PIPE,
                                         stderr=self.stderr, pass_fds=pass_fds, start_new_session=True, env=self.env,
                                         cwd=self.cwd)
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            raise
        finally:
            if w >= 0:
                os.close(w)
        if not self.ready_fd_flag:
            assert self.proc.stdout is not None
            self._fd = self.proc.stdout.fileno()
        assert self.proc.stdin is not None
        try:
            if config is not None:
                self.proc.stdin.write(config)
                self.proc.stdin.flush()
            if not keep_stdin:
                self.proc.stdin.close()
        except OSError:
            pass  # it died at once: wait_ready says so

    def _start_spawned(self, config: bytes | None, keep_stdin: bool) -> None:
        assert self.spawn is not None
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            handle = self.spawn(self.argv, in_r, out_w, self.stderr if self.stderr is not None else 2)
        except BaseException:
            for fd in (in_w, out_r):
                os.close(fd)
            raise
        finally:
            os.close(in_r)
            os.close(out_w)
        spawned = self.proc = _Spawned(handle, os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb"))
        self._fd = out_r
        try:
            if config is not None:
                spawned.stdin.write(config)
                spawned.stdin.flush()
            if not keep_stdin:
                spawned.stdin.close()
        except OSError:
            pass  # it died at once: wait_ready says so

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit by itself (``subprocess.TimeoutExpired`` after ``timeout`` s)."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def send(self, line: bytes) -> None:
        """One line to the child's stdin (``switch M``)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def read_line(self, timeout: float) -> str:
        """The child's next line, stripped; "" if none came within ``timeout`` s or its end of the pipe closed."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or self._fd < 0:
                return ""
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                return ""
            chunk = os.read(self._fd, 4096)
            if not chunk:
                self.eof = True
                return ""
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode(errors="replace").strip()

    def wait_ready(self, timeout: float) -> str:
        """The child's first line (its "ready", or why not); "" when it said nothing within ``timeout`` s
        (then :attr:`returncode` says whether it exited)."""
        return self.read_line(timeout)

    def detach(self) -> None:
        """Let the child go on without us (a shared agent outlives the script that started it):
        close our ends of its pipes, stop nothing."""
        p = self.proc
        for f in ((p.stdin, p.stdout) if p is not None else ()):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:
                    pass  # a broken pipe on a last flush: nothing was left to say
        if self.ready_fd_flag and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def stop(self, deadline: float) -> int | None:
        """End the child: close its stdin (its cue to end), wait until ``deadline`` (``time.monotonic()``),
        then SIGKILL.  Safe to call twice; returns its exit code."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            try:
                if p.stdin is not None:
                    p.stdin.close()
            except OSError:
                pass  # a pipe the child already closed: it is ending
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in (p.stdout, p.stdin):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:
                    pass  # a broken pipe on a last flush: the child is gone either way
        if self.ready_fd_flag and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        return p.returncode


class SpawnedChild(Protocol):
    """What a :data:`Spawn` returns: a started child, as much of ``subprocess.Popen`` as a helper uses."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; ``subprocess.TimeoutExpired`` after ``timeout`` s."""
        ...

    def kill(self) -> None: ...


#: ``spawn(argv, stdin_fd, stdout_fd, stderr_fd)``: start ``argv`` (``[python, "-m", module, *args]``)
#: with those descriptors as its stdio (the spawner dups what it keeps), in a session of its own.
Spawn = Callable[[list[str], int, int, int], SpawnedChild]


class _Spawned:
    """A :class:`SpawnedChild` with the pipes to it: the parts of a ``Popen`` :class:`HelperProcess` uses."""

    def __init__(self, child: SpawnedChild, stdin: Any, stdout: Any):
        self.child = child
        self.stdin = stdin
        self.stdout = stdout

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def returncode(self) -> int | None:
        return self.child.poll()

    def poll(self) -> int | None:
        return self.child.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.child.wait(timeout)

    def kill(self) -> None:
        self.child.kill()
