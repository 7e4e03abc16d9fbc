"""The warm runner: ``monarch run`` forked from a process that has imported it already.

A warm ``monarch run -- CMD`` does little work (read the reservation, one message to each host,
wait for their ends), but a fresh Python must first import what does it: ~40 ms of CPU, most of
the command's time.  So the first lean ``monarch run`` (:mod:`monarch_cli.lean`) of a user, an
interpreter and a code tree starts this runner, detached, and runs in-process as usual; the
next ones connect to it, hand it their command line, working directory, environment, umask and
stdin/stdout/stderr (the descriptors themselves, over the socket), and the runner forks a child
that runs exactly what the command would have run in-process (:func:`monarch_cli.lean.lean_run`),
writing straight to the user's terminal or pipe.  The command waits for the child's exit status
and exits with it; a signal it gets (Ctrl-C, SIGTERM, SIGHUP) is passed on to the child, whose
run stops its ranks as it would in-process (Ctrl-Z stops the child with it, ``fg`` continues both); if the command dies (kill -9), the runner kills the
child, and the run's host agents see their client go, as they would have.

A lean ``monarch sync`` or ``monarch query SQL`` line goes the same way: each is tens of ms of
work behind ~100 ms of imports (the query's Rich table, the sync's packer and messages).

What it does not take: anything but a lean run, sync or query line, an actor program (``monarch run x.py``:
Ctrl-C must reach the program itself), a process that is not this user's (``SO_PEERCRED`` on
both ends: nobody else may answer or ask), another interpreter, search path, code tree or
``MONARCH_*`` setting (each is a runner of its own: they name its socket), and code edited since
the runner started (it refuses, and exits; the command runs in-process and starts a fresh one).
Idle for :data:`IDLE_S` seconds it exits.  ``MONARCH_WARM_RUN=0`` turns it off (the test suite
does, except where it tests it).

Imported by every lean ``monarch run``: this module imports only what the client side needs.
"""

from __future__ import annotations

import os
import sys

ENV = "MONARCH_WARM_RUN"
IDLE_ENV = "MONARCH_WARM_RUN_IDLE_S"
#: How long the runner waits for a next command before it exits.
IDLE_S = 120.0
#: ``MONARCH_*`` variables that differ per command and are read when the command runs, not when
#: the runner imported its modules: they do not make another runner.
_PER_COMMAND_ENV = frozenset({"MONARCH_JOB", "MONARCH_RUN_JOB", "MONARCH_RUN_ID", "MONARCH_TEST_SESSION",
                              "MONARCH_OUTPUT_DIR", "MONARCH_HOSTNAME", "MONARCH_WARN_BEFORE", "_MONARCH_WARM_PATH"})
#: The runner's start: the command's own search path (passed in _MONARCH_WARM_PATH), then the runner,
#: so that the runner imports exactly the modules the command would have.
_BOOT = ("import json, os, sys; sys.path[:] = json.loads(os.environ.pop('_MONARCH_WARM_PATH')); "
         "from monarch_cli.warm import serve; serve()")
#: Locale and I/O settings an interpreter reads at its start.
_START_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONHASHSEED", "PYTHONWARNINGS")
_MAX_MSG = 1 << 20
#: How long the runner waits for a connected command's request.
_REQUEST_S = 2.0
#: What the runner imports once, so that its children start with it: the lean run's whole path.
PRELOAD = ("monarch_cli.lean", "monarch_cli.commands.run_core", "monarch_cli.errors", "monarch._workbench.run",
           "monarch._workbench.reserve", "monarch._workbench.state", "monarch._workbench.hosts",
           "monarch_agents.client", "monarch_agents.supervision", "monarch_schedulers.local", "rich.console",
           "rich.markup",
           # A reservation with a workspace pushes changed files before each run (~60 ms to import).
           "monarch._workbench.workspace",
           # Hosts on other machines (or network namespaces) are reached over TCP and CURVE: imported
           # here, made in the child (an import starts no thread, so forking stays safe).
           "zmq", "monarch_agents.zap",
           # The lean sync and query (their answers printed as the Click commands print them).
           "monarch_cli.commands.sync_core", "monarch_cli.commands.query_core", "monarch._workbench.telemetry",
           "monarch_agents.fanout", "rich.table")


def _key() -> str:
    """What makes a runner this command's: user, interpreter, search path, code tree, settings."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    settings = sorted((k, v) for k, v in os.environ.items()
                      if (k.startswith("MONARCH_") and k not in _PER_COMMAND_ENV) or k in _START_ENV)
    # Not sys.path[0]: the script's folder or, for `python -m`, the working directory, which would make
    # a runner per folder a command is typed in (the code's own folder is `here`).
    return repr((os.getuid(), sys.executable, here, sys.path[1:], settings))


def _socket_name(key: str) -> str:
    import zlib  # not hashlib (~3 ms): the name only has to differ, and the key itself is checked

    return f"\0monarch-warm-run-{os.getuid()}-{zlib.crc32(key.encode()):08x}-{len(key)}"


def _peer_uid(sock) -> int:
    import _socket
    import struct

    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def enabled(argv: list[str]) -> bool:
    """Whether this command line may go to the runner (a lean run line, not an actor program; a lean
    sync or query line)."""
    if os.environ.get(ENV, "1") == "0":
        return False
    from monarch_cli.lean import LeanRun, parse

    cmd = parse(argv)
    return cmd is not None and not (isinstance(cmd, LeanRun) and cmd.command[0].endswith(".py"))


# -- the command's side --------------------------------------------------------------------------


def warm_run(argv: list[str]) -> int | None:
    """Run ``argv`` (a lean run, sync or query line) in a child of the warm runner: its exit code; None when there is
    no runner to take it (one is started for the next command) or it refused: run it in-process.

    The low-level modules only (``_socket``, ``_signal``: ``socket``, ``signal`` and ``json`` import
    ``enum`` and ``re``, ~6 ms): the request is a Python literal, the answers ``pid N``/``exit N``."""
    import _signal
    import _socket
    import struct

    # Our signals go to the child once it is known; one that comes before is held until then (or, if
    # the run does not go to the runner after all, ends this command as an interrupt before it began).
    target: list[int] = []
    pending: list[int] = []

    def forward(signum, frame):
        if not target:
            pending.append(signum)
            return
        try:
            os.kill(target[0], signum)
        except ProcessLookupError:
            pass

    def pause(signum, frame):  # Ctrl-Z: the child stops with us (in-process, the run would have)
        if target:
            forward(_signal.SIGSTOP, frame)
        os.kill(os.getpid(), _signal.SIGSTOP)

    stopping = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
    old = {s: _signal.signal(s, forward) for s in (*stopping, _signal.SIGCONT)}
    old[_signal.SIGTSTP] = _signal.signal(_signal.SIGTSTP, pause)
    key = _key()
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    pid = 0
    try:
        sock.connect(_socket_name(key))
        if _peer_uid(sock) == os.getuid():  # else another user holds the name: never hand them our terminal
            umask = os.umask(0o077)
            os.umask(umask)
            request = {"key": key, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask}
            sock.sendmsg([repr(request).encode()],
                         [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
            answer = sock.recv(_MAX_MSG).split()
            # Else refused (code edited, another key): in-process, as if it were not there.
            if len(answer) == 2 and answer[0] == b"pid":
                pid = int(answer[1])
    except (ConnectionRefusedError, FileNotFoundError):
        _start_runner()
    except OSError:
        pass
    if not pid:
        sock.close()
        for s, h in old.items():
            _signal.signal(s, h)
        if any(s in stopping for s in pending):
            sys.stderr.write("interrupted\n")
            return 130
        return None
    target.append(pid)
    for s in pending:
        forward(s, None)
    try:
        answer = sock.recv(_MAX_MSG).split()
    except OSError:
        answer = []
    finally:
        sock.close()
    if len(answer) != 2 or answer[0] != b"exit":
        sys.stderr.write("error: the warm runner ended during the run (`monarch logs` has the ranks' output); "
                         f"{ENV}=0 runs without it\n")
        return 1
    return int(answer[1])


def _start_runner() -> None:
    """Start a runner, detached (its own session, stdio on /dev/null), for the next command."""
    import json

    try:
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            env = {**os.environ, "_MONARCH_WARM_PATH": json.dumps(sys.path)}
            os.posix_spawn(sys.executable, [sys.executable, "-c", _BOOT], env, setsid=True,
                           file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
                                         (os.POSIX_SPAWN_DUP2, devnull, 2)])
        finally:
            os.close(devnull)
    except OSError:
        pass  # only speed is lost


# -- the runner's side ---------------------------------------------------------------------------


def _code_files() -> dict[str, int]:
    """Our loaded modules' files and their mtimes: a change to one means the runner runs old code."""
    roots = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), p) + os.sep
                  for p in ("monarch", "monarch_cli", "monarch_agents", "monarch_schedulers", "monarch_rdmafs",
                            "monarch_telemetry"))
    files = {}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and f.startswith(roots):
            try:
                files[f] = os.stat(f).st_mtime_ns
            except OSError:
                files[f] = -1
    return files


def _edited(files: dict[str, int]) -> bool:
    for f, mtime in files.items():
        try:
            if os.stat(f).st_mtime_ns != mtime:
                return True
        except OSError:
            return True
    return False


def serve() -> None:
    """The runner: preload, listen, fork a child per command, report each child's exit status."""
    import importlib
    import select
    import signal
    import socket
    import time

    for mod in PRELOAD:
        try:
            importlib.import_module(mod)
        except Exception:  # noqa: S112  (a missing optional module only costs its child the import)
            continue
    key = _key()
    files = _code_files()
    # Hold no one's folder (a mount the user later unmounts): each child enters its command's own.
    os.chdir("/")
    idle_s = float(os.environ.get(IDLE_ENV, IDLE_S))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        listener.bind(_socket_name(key))
    except OSError:
        return  # another runner took the name first
    listener.listen(64)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}  # child pid -> its command's connection
    watched: dict[int, int] = {}  # a running child's command's connection (fd) -> the child's pid
    last = time.monotonic()
    while True:
        timeout = None if children else max(0.0, last + idle_s - time.monotonic())
        try:
            ready, _, _ = select.select([listener, wake_r, *watched], [], [], timeout)
        except InterruptedError:
            continue
        if not ready and not children:
            return  # idle: the name goes with the socket
        last = time.monotonic()
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children, watched)
        for fd in ready:
            if isinstance(fd, int) and fd in watched:
                # The command's connection is readable only when it went away (it sends nothing more):
                # the child goes too, as the run's client would have with it.
                pid = watched.pop(fd)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if listener in ready:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            # A command sends its request at once: one that stalls (stopped between connect and send)
            # must not hold up the others behind it.
            conn.settimeout(_REQUEST_S)
            if _peer_uid(conn) != os.getuid():
                conn.close()
                continue
            pid = _take(conn, key, files, children, listener, wake_r, wake_w)
            if pid:
                watched[conn.fileno()] = pid
            elif _edited(files):
                return  # old code: the command runs in-process and starts a fresh runner


def _take(conn, key: str, files: dict[str, int], children: dict, listener, wake_r: int, wake_w: int) -> int:
    """One command: fork its child (its pid), or refuse it (0, connection closed)."""
    import ast
    import socket

    fds: list[int] = []
    req: dict = {}
    try:
        data, fds, _, _ = socket.recv_fds(conn, _MAX_MSG, 3)
        req = ast.literal_eval(data.decode())  # a literal: never code, whatever it holds
        ok = isinstance(req, dict) and req.get("key") == key and len(fds) == 3 and not _edited(files)
    except (OSError, ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        ok = False
    if not ok:
        for fd in fds:
            os.close(fd)
        try:
            conn.send(b"refused")
        except OSError:
            pass
        conn.close()
        return 0
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            for other in children.values():
                other.close()
            os.close(wake_r)
            os.close(wake_w)
            code = _child(req, fds, conn)
        except BaseException as e:  # noqa: BLE001  (the child must never return into the runner's loop)
            try:
                os.write(2, f"error: the warm runner's child failed: {type(e).__name__}: {e}\n".encode())
            except OSError:
                pass
            code = 1
        os._exit(code)
    for fd in fds:
        os.close(fd)
    try:
        conn.send(b"pid %d" % pid)
    except OSError:
        pass
    children[pid] = conn
    return pid


def _reap(children: dict, watched: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        watched.pop(conn.fileno(), None)
        code = os.waitstatus_to_exitcode(status)
        try:
            conn.send(b"exit %d" % (128 - code if code < 0 else code))
        except OSError:
            pass
        conn.close()


def _child(req: dict, fds: list[int], conn) -> int:
    """In the forked child: become the command (its stdio, directory, environment, umask), then run."""
    import signal

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.umask(int(req["umask"]))
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    # Python's own stdio, as the command's interpreter would have made them on these descriptors.
    enc = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    out_errors = sys.stdout.errors if sys.stdout is not None else "strict"
    sys.stdin = open(0, encoding=enc, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, encoding=enc, errors=out_errors,  # noqa: SIM115
                      closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding=enc, errors="backslashreplace", closefd=False)  # noqa: SIM115
    if "random" in sys.modules:
        import random

        random.seed()  # every child would otherwise draw the runner's sequence
    sys.argv = ["monarch", *req["argv"]]
    from monarch._workbench import command_process
    from monarch_cli.lean import lean_command

    command_process()
    code = lean_command(list(req["argv"]))
    if code is None:  # the runner only takes lean lines; a parse that changed its mind is a bug
        sys.stderr.write("error: the warm runner was handed a command line it cannot run\n")
        code = 1
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # The command hears its status from us, at once: not after the runner is woken to reap us (the
    # runner still reports the status of a child that died without saying it: a signal).
    try:
        conn.send(b"exit %d" % int(code))
    except OSError:
        pass
    return int(code)


