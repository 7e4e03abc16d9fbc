"""The warm fork server: the reason a proc starts in milliseconds.

A host agent starts one zygote when it starts.  The zygote imports the
runtime (and heavy libraries such as torch, once) and then waits; each request
forks it, so a new proc agent begins life with everything already imported.
The same fork, followed by ``exec``, starts plain commands (``monarch run``):
one place spawns children, sets their process group, stdio and death signal,
and reports how they exited.

A plain command (no terminal) is not forked from the zygote but spawned (``posix_spawn``: the
child shares the zygote's memory until it execs, instead of copying its page tables and faulting
on every page either side writes next): ~1.5 ms of CPU instead of ~9-10 ms for a zygote of ~50 MiB,
the most of what a ``monarch run -- true`` costs a host.  The child still dies with the zygote:
it starts as ``setpriv --pdeathsig KILL -- CMD`` (util-linux), which asks for the parent-death
signal and execs the command.  A host without such a ``setpriv``, a command not found, a terminal,
or ``MONARCH_EXEC_SPAWN=0`` (the agent's, or the command's own) take the fork as before (and its
error messages).

The zygote is single-threaded and has no ZeroMQ context, so forking it is
safe.  It talks to its host agent over a SOCK_SEQPACKET socket pair: JSON
requests carrying the child's stdio as passed file descriptors; JSON events
back (``spawned``, ``exited``).  When the host agent dies the zygote gets
SIGTERM (parent-death signal), kills every child's process group, and exits.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback

_PR_SET_PDEATHSIG = 1
#: The descriptor soft limit this process tree had before an agent raised it (``transport.raise_fd_limit``):
#: a command or shell started here gets it back, as if started from the user's shell.
NOFILE_ENV = "MONARCH_NOFILE_SOFT"
#: Names a spawner removed from its environment, comma-separated (``monarch.actor``'s env_changes).
ENV_UNSET = "MONARCH_ENV_UNSET"
#: What sets the intra-op thread count of a library imported here (torch, numpy's BLAS) at its import.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: torch's thread count as this process imported it (None: torch was not preloaded): a child whose
#: environment sets none gets this one back, one that sets OMP_NUM_THREADS gets its own.
_preload_threads: int | None = None
#: What every zygote imports, whatever ``--preload`` names (asyncio: async actors, imported lazily).
ALWAYS_PRELOAD = ("monarch_agents.proc_agent", "asyncio")
_MAX_FDS = 4
#: ``MONARCH_EXEC_SPAWN=0`` where the agent starts: every command forked from the zygote (a way out);
#: in a command's own environment: that command (the spawn's baseline, in one reservation).
SPAWN_ENV = "MONARCH_EXEC_SPAWN"
#: The signals a command gets back at their defaults, as from a shell: the zygote's handlers, and the
#: two Python ignores (a rank writing to a closed pipe dies of it, as ``yes | head`` expects).
_DEFAULT_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent thread exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def describe_status(status: int) -> tuple[int | None, str]:
    """(exit code, reason) for a ``waitpid`` status, e.g. ``(None, 'killed by SIGKILL')``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return -sig, f"killed by {name}"
    code = os.WEXITSTATUS(status)
    return code, f"exited with code {code}"


class Zygote:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        # Passed down as inheritable (pass_fds): a spawned command must not get it (a forked child closes it).
        os.set_inheritable(sock.fileno(), False)
        self.children: dict[int, str] = {}
        #: ``[setpriv, --pdeathsig, KILL, --]`` for a spawned command; [] once found missing (fork then);
        #: None until the first command asks.
        self._spawn_prefix: list[str] | None = None if os.environ.get(SPAWN_ENV, "1") != "0" else []
        self._home_fd = -1  # the zygote's own working directory, gone back to after a spawn

    def serve(self) -> None:
        rfd, wfd = os.pipe()
        os.set_blocking(wfd, False)
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self._shutdown())
        self._send({"op": "ready", "pid": os.getpid()})
        while True:
            try:
                ready, _, _ = select.select([self.sock, rfd], [], [])
            except InterruptedError:
                continue
            if rfd in ready:
                os.read(rfd, 4096)
                self._reap()
            if self.sock in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, _MAX_FDS)
                except (ConnectionError, OSError):
                    data, fds = b"", []
                if not data:
                    self._shutdown()
                self._handle(json.loads(data), fds)

    def _handle(self, req: dict, fds: list[int]) -> None:
        cwd = req.get("cwd")
        problem = f"working directory {cwd} does not exist on this host" if cwd and not os.path.isdir(cwd) else ""
        pid = -1
        if not problem and req.get("kind") == "exec" and not req.get("pty"):
            pid = self._spawn(req, fds)
            if pid > 0:
                for fd in fds:
                    os.close(fd)
                self.children[pid] = "exec"
                self._send({"op": "spawned", "id": req["id"], "pid": pid})
                return
        if not problem:
            try:
                pid = os.fork()
            except OSError as e:
                problem = str(e)
        if problem:
            for fd in fds:
                os.close(fd)
            self._send({"op": "error", "id": req["id"], "error": problem})
            return
        if pid == 0:
            _child(req, fds, self.sock)  # never returns
        for fd in fds:
            os.close(fd)
        self.children[pid] = req.get("kind", "")
        _wait_for_own_group(pid)
        self._send({"op": "spawned", "id": req["id"], "pid": pid})

    def _spawn(self, req: dict, fds: list[int]) -> int:
        """Start the command ``req`` names by ``posix_spawn``, as :func:`_child` would by fork then exec
        (stdio, own session, environment, working directory, descriptor limit, parent-death signal);
        its pid, or -1 when it has to take the fork (no ``setpriv``, the command not found: the fork's
        exec words that error).  Safe here only because the zygote has one thread: it changes its own
        working directory and descriptor limit for the spawn's moment."""
        prefix = self._spawn_prefix
        if prefix is None:
            prefix = self._spawn_prefix = _find_setpriv()
        argv = req.get("argv") or []
        if not prefix or not argv or len(fds) not in (2, 3):
            return -1
        given = req.get("env")
        env = dict(os.environ if given is None else given)
        for name in env.pop(ENV_UNSET, "").split(","):
            env.pop(name, None)
        if env.get(SPAWN_ENV) == "0":  # this command asks for the fork (`monarch run -e MONARCH_EXEC_SPAWN=0`)
            return -1
        actions: list[tuple] = []
        if len(fds) == 3:
            stdin, stdout, stderr = fds
            actions.append((os.POSIX_SPAWN_DUP2, stdin, 0))
        else:
            stdout, stderr = fds
            actions.append((os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
        actions += [(os.POSIX_SPAWN_DUP2, stdout, 1), (os.POSIX_SPAWN_DUP2, stderr, 2)]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in sorted(set(fds)) if fd > 2]
        cwd = req.get("cwd")
        limit = _user_fd_limit(env)
        try:
            if self._home_fd < 0:
                self._home_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            if cwd:
                os.chdir(cwd)
            try:
                # Found as execvpe would (a relative path from the command's working directory), else
                # the fork's exec words the error.  setpriv looks it up again the same way (the same PATH
                # and folder), so the command gets its argv[0] as given.
                if _which(argv[0], env.get("PATH", os.defpath)) is None:
                    return -1
                if limit is not None:
                    import resource

                    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
                    resource.setrlimit(resource.RLIMIT_NOFILE, limit)
                try:
                    return os.posix_spawn(prefix[0], [*prefix, *argv], env, file_actions=actions,
                                          setsid=True, setsigdef=_DEFAULT_SIGNALS)
                finally:
                    if limit is not None:
                        resource.setrlimit(resource.RLIMIT_NOFILE, saved)
            finally:
                os.fchdir(self._home_fd)
        except (OSError, NotImplementedError, AttributeError):
            # The fork's exec says what is wrong, as it always has (a libc without posix_spawn's
            # setsid, NotImplementedError, takes the fork too).
            return -1

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.pop(pid, None)
            code, reason = describe_status(status)
            self._send({"op": "exited", "pid": pid, "code": code, "reason": reason})

    def _send(self, event: dict) -> None:
        try:
            self.sock.send(json.dumps(event).encode())
        except OSError:
            self._shutdown()

    def _shutdown(self) -> None:
        for pid, kind in list(self.children.items()):
            try:
                # A helper (a workspace mount) is told to end, so it unmounts; anything else is killed.
                os.killpg(pid, signal.SIGTERM if kind == "call" else signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)


def _find_setpriv() -> list[str]:
    """``setpriv --pdeathsig KILL --`` when this host has one that takes it (util-linux 2.33+), else []."""
    import shutil
    import subprocess

    path = shutil.which("setpriv")
    if path is None:
        return []
    prefix = [path, "--pdeathsig", "KILL", "--"]
    try:
        ok = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else []


def _which(cmd: str, path: str) -> str | None:
    """Where ``execvpe`` would find ``cmd`` on ``path`` (None: not there, or not executable)."""
    if os.sep in cmd:
        return os.path.abspath(cmd) if os.access(cmd, os.X_OK) and not os.path.isdir(cmd) else None
    for d in path.split(os.pathsep):
        full = os.path.join(d or ".", cmd)
        if os.access(full, os.X_OK) and not os.path.isdir(full):
            return os.path.abspath(full)
    return None


def _user_fd_limit(env: dict) -> tuple[int, int] | None:
    """The descriptor limit a command gets (see :func:`_restore_fd_limit`), None: this one."""
    text = env.get(NOFILE_ENV, "")
    if not text.isdigit():
        return None
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = int(text)
    return (want, hard) if want < soft else None


def _wait_for_own_group(pid: int, deadline_s: float = 0.5) -> None:
    """Wait (briefly) until the new child has called setsid().

    The host agent signals a child's whole process group (``killpg(pid)``) as soon as it hears
    "spawned"; a signal sent before the child leads its own group would miss it, or reach it
    while it still runs the zygote's handlers.  setsid() is the child's first system calls away,
    so this is microseconds.
    """
    import time

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if os.getpgid(pid) == pid:
                return
        except ProcessLookupError:
            return  # already gone: its exit is reported as usual
        os.sched_yield()


def _child(req: dict, fds: list[int], zsock: socket.socket) -> None:
    code = 1
    try:
        zsock.close()
        signal.set_wakeup_fd(-1)
        for sig in _DEFAULT_SIGNALS if req.get("kind") == "exec" else _DEFAULT_SIGNALS[:3]:
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        set_parent_death_signal(signal.SIGKILL)
        if req.get("pty") and fds:
            import fcntl
            import termios

            fcntl.ioctl(fds[0], termios.TIOCSCTTY, 0)
        # stdin, stdout, stderr from the passed descriptors (stdin /dev/null unless given)
        if len(fds) == 3:
            stdin, stdout, stderr = fds
        else:
            stdin = os.open(os.devnull, os.O_RDONLY)
            stdout, stderr = fds[0], fds[1]
        os.dup2(stdin, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        for fd in set(fds) | {stdin}:
            if fd > 2:
                os.close(fd)
        env = req.get("env")
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
            # Variables the spawner removed from its environment since the host agent started
            # (its request carries the agent's environment plus the spawner's changes).
            for name in os.environ.pop(ENV_UNSET, "").split(","):
                os.environ.pop(name, None)
            _adopt_environment()
        if req["kind"] == "exec":  # a user's command; the agent's own helpers ("call") keep the agent's
            _restore_fd_limit()
        if req.get("cwd"):
            try:
                os.chdir(req["cwd"])
            except OSError as e:
                os.write(2, f"monarch: cannot enter working directory {req['cwd']}: {e.strerror}\n".encode())
                os._exit(126)
        if req["kind"] == "exec":
            argv = req["argv"]
            try:
                os.execvpe(argv[0], argv, os.environ)
            except OSError as e:
                hint = ""
                if isinstance(e, FileNotFoundError) and os.sep not in argv[0]:
                    # The usual cause: a venv not activated when `monarch serve` started the agents.
                    hint = " (not on the PATH the host agent got from `monarch serve`; give its full path or serve again from an activated environment)"
                    if argv[0] == "torchrun":
                        from monarch_agents.errors import install_hint

                        hint += f"; if torch is not installed there: {install_hint('torch')}"
                os.write(2, f"monarch: cannot run {argv[0]!r}: {e.strerror}{hint}\n".encode())
                os._exit(127)
        elif req["kind"] == "call":
            # One of the agent's own helpers (a workspace mount: monarch_rdmafs.mount): its module's
            # main in this warm fork, instead of a new interpreter importing it all again.
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            sys.argv = [req["module"], *req["argv"]]
            importlib.import_module(req["module"]).main(list(req["argv"]))
            code = 0
        else:
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            from monarch_agents import proc_agent

            proc_agent.main(req["config"])
            code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: S110
            # Whatever the child's code left in sys.stdout/stderr, the process must reach _exit below,
            # and there is no stream left to report a failed flush on.
            pass
        os._exit(code)


class ZygoteClient:
    """The host agent's end: ``spawn(...)`` returns a pid; exits come as events."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock = sock
        self.pid = pid
        self._ids = 0

    @classmethod
    def start(cls, preload: list[str]) -> "ZygoteClient":
        import subprocess

        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["MONARCH_ZYGOTE_FD"] = str(child.fileno())
        env["MONARCH_ZYGOTE_PRELOAD"] = ",".join(preload)
        proc = subprocess.Popen(
            [sys.executable, "-m", "monarch_agents.zygote"],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        return cls(parent, proc.pid)

    @classmethod
    def fork(cls, preload: list[str]) -> "ZygoteClient":
        """The zygote as a fork of this process, which must have no thread but this one yet (else
        :meth:`start`).  For an agent forked from a warm launcher (``--fork-hosts``), where
        ``preload`` is imported already: the zygote costs a fork, not an interpreter and its imports,
        and shares those pages with every other agent of the machine until they are written."""
        import threading

        if threading.active_count() > 1:
            return cls.start(preload)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        agent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                parent.close()
                set_parent_death_signal(signal.SIGTERM)
                if os.getppid() != agent:  # the agent died before the signal was asked for
                    os._exit(0)
                _preload(preload)
                Zygote(child).serve()
            finally:
                os._exit(1)
        child.close()
        return cls(parent, pid)

    def stop(self, deadline: float) -> None:
        """SIGTERM the zygote (it kills its children's groups), wait for it until ``deadline``, then SIGKILL."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            pidfd = -1  # already reaped
        try:
            for sig, until in ((signal.SIGTERM, deadline), (signal.SIGKILL, time.monotonic() + 1.0)):
                if pidfd < 0:
                    break
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass
                # The pidfd reads as ready once the zygote has exited.
                if select.select([pidfd], [], [], max(0.0, until - time.monotonic()))[0]:
                    break
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass
        finally:
            if pidfd >= 0:
                os.close(pidfd)
            self.sock.close()

    def request(self, req: dict, fds: list[int]) -> int:
        self._ids += 1
        req["id"] = self._ids
        socket.send_fds(self.sock, [json.dumps(req).encode()], fds)
        return self._ids

    def recv_event(self) -> dict | None:
        try:
            data = self.sock.recv(1 << 20)
        except OSError:
            return None
        if not data:
            return None
        return json.loads(data)


def main() -> None:
    set_parent_death_signal(signal.SIGTERM)
    fd = int(os.environ.pop("MONARCH_ZYGOTE_FD"))
    preload = [m for m in os.environ.pop("MONARCH_ZYGOTE_PRELOAD", "").split(",") if m]
    sock = socket.socket(fileno=fd)
    _preload(preload)
    Zygote(sock).serve()


def _preload(preload: list[str], *, neutral: bool = False, who: str = "monarch zygote") -> None:
    """Everything a proc agent needs, imported once here instead of once per proc; the API its user
    code imports is named by whoever started the host agent (--preload), a layer above this one.

    ``neutral``: import without :data:`THREAD_ENV` (a shared agent, whose procs belong to scripts of
    other environments than the one that started it): each proc then sets torch's thread count from
    its own environment (:func:`_adopt_environment`) instead of inheriting the first script's."""
    global _preload_threads
    saved = {k: os.environ.pop(k) for k in THREAD_ENV if k in os.environ} if neutral else {}
    try:
        for mod in [*ALWAYS_PRELOAD, *preload]:
            try:
                importlib.import_module(mod)
            except Exception as e:  # a missing optional library only costs speed
                print(f"{who}: could not preload {mod}: {e}", file=sys.stderr)
        torch = sys.modules.get("torch")
        if torch is not None and _preload_threads is None:
            try:
                _preload_threads = int(torch.get_num_threads())
            except Exception:  # noqa: S110  (a torch without it: nothing to give back)
                pass
    finally:
        os.environ.update(saved)


def _thread_count(env: dict | os._Environ) -> int | None:
    """The intra-op thread count ``env`` asks for (``OMP_NUM_THREADS=4``, or ``4,2``: the outer level)."""
    for k in THREAD_ENV:
        first = str(env.get(k, "")).split(",")[0].strip()
        if first.isdigit() and int(first) > 0:
            return int(first)
    return None


def _adopt_environment() -> None:
    """Make this child's environment (just put in ``os.environ``) count where modules imported by the
    zygote read theirs at import: torch's thread count, the time zone, tempfile's folder, the
    bytecode flag.  What cannot follow (see the README's "Procs and their environment"): numpy's
    BLAS threads, ``PYTHONHASHSEED``, ``PYTHONWARNINGS``, and anything else a preloaded module
    cached at import."""
    import time as _time

    _time.tzset()  # TZ
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None  # TMPDIR, read again at the next use
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    torch = sys.modules.get("torch")
    if torch is not None:
        want = _thread_count(os.environ) or _preload_threads
        try:
            if want and torch.get_num_threads() != want:
                torch.set_num_threads(want)
        except Exception as e:  # the proc runs on with the zygote's count, and says so
            print(f"monarch: could not set torch's thread count to {want}: {e}", file=sys.stderr)


def _restore_fd_limit() -> None:
    """The soft descriptor limit the user had (:data:`NOFILE_ENV`), not the one an agent raised."""
    text = os.environ.get(NOFILE_ENV, "")
    if not text.isdigit():
        return
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = int(text)
        if want < soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError):
        pass  # the raised one stays: more descriptors than asked for, never fewer


if __name__ == "__main__":
    main()
