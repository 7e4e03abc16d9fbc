"""``monarch.job.exec_command``: run a command on every host (or proc) of a mesh, as PyTorch Monarch's.

    from monarch.job import ProcessJob, exec_command
    hosts = ProcessJob({"hosts": 2}).state().hosts
    rc = exec_command(hosts, ["nvidia-smi"]).get()          # the highest exit code of all ranks
    exec_command(hosts, ["train.py", "--lr", "0.1"], per_host={"gpus": 2}, output_dir="out/$SUBDIR").get()

The command starts at once (on a thread of this process); the returned Future only observes it:
dropping it, or a ``get()`` that times out, does not cancel the command.  As in Monarch (0.7.0), a
normal interpreter exit waits for the command (the thread is not a daemon): that wait ends when the
command ends, when its procs or hosts are lost (supervision fails the call), when the client shuts
down (``shutdown_context()`` stops its procs) or at a signal (Ctrl-C).  After the command, the
procs' stop is bounded by the stop settings (:func:`_stop_wait_s`), so nothing but the command
itself holds the exit.  Each rank runs it in a proc of its own, spawned for the call and stopped when it ends, with
``MONARCH_RANK_<dim>``/``MONARCH_SIZE_<dim>`` in its environment.  A command whose first word
ends in ``.py`` (or ``["-m", module, ...]``) runs under the procs' Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

from monarch.actor import Actor, Future, context, endpoint
from monarch._workbench.exit_status import exit_status


def _private(path: str, flags: int) -> int:
    """``open``'s opener for a new file only its user may read (an existing one is made so too), never
    through a link."""
    fd = os.open(path, flags | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


class _Command(Actor):
    """Runs one command in its proc's host and reports its exit code and output."""

    def _rank_env(self) -> dict[str, str]:
        point = context().actor_instance.rank
        env = {f"MONARCH_RANK_{k}": str(point[k]) for k in point}
        env.update({f"MONARCH_SIZE_{k}": str(point.size(k)) for k in point})
        return env

    def _subdir(self, output_dir: str) -> str:
        point = context().actor_instance.rank
        return output_dir.replace("$SUBDIR", "_".join(f"{k}_{point[k]}" for k in point) or "rank_0")

    @endpoint
    def run(self, cmd: list[str], env: dict[str, str] | None, workdir: str | None, client_cwd: str,
            output_dir: str | None) -> dict:
        argv = list(cmd)
        if argv[0] == "-m" or argv[0].endswith(".py"):
            argv = [sys.executable, *argv]
        cwd = workdir or (client_cwd if os.path.isdir(client_cwd) else None)
        full_env = {**os.environ, **self._rank_env(), **(env or {})}
        if output_dir is not None:
            out_dir = self._subdir(output_dir)
            # What a command prints is its owner's: the folders made for it are 0700 and its
            # files 0600 (a default such as /tmp/monarch_exec_ID is in a folder everyone reads).
            from monarch_rdmafs.private import make_dirs

            make_dirs(out_dir)
            with open(os.path.join(out_dir, "stdout.txt"), "w", opener=_private) as out, \
                    open(os.path.join(out_dir, "stderr.txt"), "w", opener=_private) as err:
                code = _run(argv, cwd, full_env, out, err)
            return {"returncode": code, "stdout": "", "stderr": ""}
        r = _run(argv, cwd, full_env, subprocess.PIPE, subprocess.PIPE, capture=True)
        return r


def _run(argv: list[str], cwd: str | None, env: dict, out: Any, err: Any, capture: bool = False) -> Any:
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                           text=capture)
    except FileNotFoundError:
        msg = f"{argv[0]}: command not found\n"
        if capture:
            return {"returncode": 127, "stdout": "", "stderr": msg}
        err.write(msg)
        return 127
    code = exit_status(p.returncode)
    if capture:
        return {"returncode": code, "stdout": p.stdout, "stderr": p.stderr}
    return code


def _stop_wait_s() -> float:
    """How long the command's procs may take to stop: every proc's answer (one shared
    ``stop_actor_timeout``), then the hosts' (``proc_stop_max_idle``), each host killing what is left
    after ``mesh_terminate_timeout``; a few seconds more for the answers to come back."""
    from monarch import config

    return (config.seconds("stop_actor_timeout") + config.seconds("proc_stop_max_idle")
            + config.seconds("mesh_terminate_timeout") + 5.0)


def exec_command(host_mesh: Any, cmd: list[str], env: dict[str, str] | None = None, workdir: str | None = None,
                 output_dir: str | None = None, rank: int | None = None, point: dict[str, int] | None = None,
                 per_host: dict[str, int] | None = None) -> Future:
    """Run ``cmd`` on ``host_mesh`` (one rank per host, or ``per_host`` procs per host) and return a
    Future of the highest exit code (0: every rank succeeded).

    ``rank`` (a flat host index) or ``point`` (``{"hosts": 1}``) narrows it to one place;
    ``output_dir`` sends each rank's stdout/stderr to ``stdout.txt``/``stderr.txt`` there
    (``$SUBDIR`` becomes the rank's coordinates), else they are printed here.
    """
    if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(a, str) for a in cmd):
        raise ValueError(f"cmd must be a non-empty list of strings, got {cmd!r}")
    if rank is not None and point is not None:
        raise ValueError("rank and point are mutually exclusive")
    if point is not None:
        target = host_mesh.slice(**point)
    elif rank is not None:
        hosts = host_mesh.hosts
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(hosts):
            raise ValueError(f"rank {rank!r} is not a host of this mesh (0..{len(hosts) - 1})")
        target = type(host_mesh)([hosts[rank]])
    else:
        target = host_mesh
    result: Future = Future()
    cwd = os.getcwd()

    def work() -> None:
        try:
            procs = target.spawn_procs(per_host=per_host)
            try:
                runs = procs.spawn("exec_command", _Command).run.call(list(cmd), env, workdir, cwd, output_dir).get()
                worst = 0
                for r in runs.values():
                    worst = max(worst, int(r.get("returncode", 1)))
                    if r.get("stdout"):
                        sys.stdout.write(r["stdout"])
                    if r.get("stderr"):
                        sys.stderr.write(r["stderr"])
                sys.stdout.flush()
            finally:
                procs.stop().get(timeout=_stop_wait_s())
            result.set_result(worst)
        except BaseException as e:  # every outcome settles the Future
            result.set_exception(e)

    threading.Thread(target=work, name="monarch-exec-command", daemon=False).start()
    return result


__all__ = ["exec_command"]
