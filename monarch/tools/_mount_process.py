"""The process that serves a context's gather mounts between CLI commands (Monarch's job sidecar).

``python -m monarch.tools.cli apply`` returns, yet the job's gather mounts (``job.gather_mount``)
must stay mounted here for later commands and the user's shell.  ``ensure(state_path, gathers)``
starts one detached process per reservation that opens them and keeps them until the
reservation's state file is gone or names another job (``kill``, ``context rm``, ``monarch
stop``), or it is told to stop; then it unmounts and ends.  Re-applying the same mounts keeps the
process; other mounts replace it.

Its pid and what it serves are kept beside the state file (``.state.pkl.mounts.json``, 0600), its
log beside that (``.state.pkl.mounts.log``).  A pid is signalled only if that process's command line
is this module's for this state file (a pid may have been reused).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

_MODULE = "monarch.tools._mount_process"
_READY_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 15.0
_POLL_S = 1.0


def _files(state_path: str) -> tuple[str, str]:
    folder, base = os.path.split(os.path.abspath(state_path))
    return os.path.join(folder, f".{base}.mounts.json"), os.path.join(folder, f".{base}.mounts.log")


def _job_id(state_path: str) -> str | None:
    from monarch._workbench.state import load_state

    try:
        return load_state(state_path).job_id
    except Exception:
        return None


def _key(state_path: str, gathers: list) -> str:
    what = json.dumps([_job_id(state_path), [list(g[1:3]) + [g[3]] for g in gathers]], default=str)
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def _ours(pid: int, state_path: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return _MODULE.encode() in argv and os.path.abspath(state_path).encode() in argv


def _record(state_path: str) -> dict[str, Any] | None:
    try:
        with open(_files(state_path)[0]) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ensure(state_path: str, gathers: list) -> None:
    """Serve ``gathers`` (a job's ``("gather", remote, local, meshes)`` specs) for the reservation at
    ``state_path`` from a process of their own, unless one already serves exactly these."""
    state_path = os.path.abspath(state_path)
    key = _key(state_path, gathers)
    rec = _record(state_path)
    if gathers and rec is not None and rec.get("key") == key and _ours(int(rec.get("pid", 0)), state_path):
        return
    stop(state_path)
    if not gathers:
        return
    from monarch_agents.files import write_atomic

    info_file, log_file = _files(state_path)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # Its own session: the CLI command that started it, and that command's terminal, may go.
        proc = subprocess.Popen([sys.executable, "-m", _MODULE, state_path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=fd, start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps([list(g[1:]) for g in gathers]).encode() + b"\n")
    proc.stdin.close()
    import select

    ready, _, _ = select.select([proc.stdout], [], [], _READY_TIMEOUT_S)
    line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
    proc.stdout.close()
    if line != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the job's gather mounts did not start ({line or 'no answer'}); see {log_file}")
    write_atomic(info_file, json.dumps({"pid": proc.pid, "key": key}).encode())


def stop(state_path: str) -> None:
    """Stop the process serving the mounts of ``state_path``'s reservation, if one runs (they unmount)."""
    state_path = os.path.abspath(state_path)
    info_file, _ = _files(state_path)
    rec = _record(state_path)
    if rec is not None:
        pid = int(rec.get("pid", 0))
        if pid > 0 and _ours(pid, state_path):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + _STOP_TIMEOUT_S
            while _ours(pid, state_path) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _ours(pid, state_path):
                os.kill(pid, signal.SIGKILL)  # its FUSE helpers unmount when it dies (they watch it)
    try:
        os.unlink(info_file)
    except FileNotFoundError:
        pass


def _serve(state_path: str, gathers: list) -> None:
    from monarch.gather_mount import gather_mount
    from monarch.job import job_load

    job_id = _job_id(state_path)
    job = job_load(state_path)
    running = job._running
    if running is None:
        raise RuntimeError(f"no running job at {state_path}")
    meshes = running._state()._hosts
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    handles = []
    try:
        for remote, local, names in gathers:
            chosen = [n for n in meshes if names is None or n in names]
            for n in chosen:
                handles.append(gather_mount(meshes[n], remote, local if len(chosen) == 1 else os.path.join(local, n)))
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        os.close(1)
        while not stopping and _job_id(state_path) == job_id:
            time.sleep(_POLL_S)
    finally:
        for h in handles:
            try:
                h.close()
            except Exception as e:
                print(f"closing a gather mount failed: {e}", file=sys.stderr)


def _main() -> None:
    state_path = sys.argv[1]
    gathers = json.loads(sys.stdin.readline())
    try:
        _serve(state_path, gathers)
    except Exception as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        try:
            sys.stdout.write(f"{type(e).__name__}: {e}\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        raise SystemExit(1) from None
    os._exit(0)  # the job's runtime threads must not hold the exit


if __name__ == "__main__":
    _main()
