"""PyTorch Monarch's ``monarch.tools.commands``: what its argparse CLI (``python -m monarch.tools.cli``)
does, callable from Python, on monarch's own machinery.

Two families, as in Monarch:

* **The job workbench** (``apply_job``, ``exec_on_job``, ``shell_on_job``, ``context_*``,
  ``load_current_job``): a job object from your module (``ProcessJob``, ``SlurmJob``, ...) becomes
  the current context's reservation, and commands run on its hosts (``monarch.job.exec_command``,
  ``monarch.job.shell``).  Contexts keep Monarch's layout in the working directory:
  ``.monarch/NAME/`` holds a context's ``spec`` (the ``module.attr`` it applies) and ``state.pkl``
  (its reservation), and ``.monarch/job_state.pkl`` is a link to the active context's state, which
  every monarch command (``monarch status``, ``job_load()``, ``job.state()``) follows.
* **TorchX servers** (``create``, ``info``, ``server_ready``, ``get_or_create``, ``kill``,
  ``kill_and_confirm``, ``torchx_runner``): a job submitted through TorchX's ``Runner`` with the
  schedulers of ``monarch.tools.config.defaults`` (TorchX's own: ``local_cwd``, ``slurm``, ...),
  described as a ``monarch.tools.mesh_spec.ServerSpec``.  TorchX is imported only by these.

Where this differs from Monarch: a job's gather mounts (``job.gather_mount``) are served by a small
process of this machine that ``apply_job`` starts for the context and that ends when the
reservation is released (Monarch's job sidecar); ``--all`` output goes to files on the hosts as in
Monarch, under the job's gather mount when it has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

from monarch.tools.colors import CYAN, ENDC

if TYPE_CHECKING:
    from monarch.job.job import JobTrait
    from monarch.tools.config import Config
    from monarch.tools.mesh_spec import ServerSpec
    from torchx.runner import Runner
    from torchx.specs import AppDryRunInfo

__all__ = [
    "apply_job", "context_create", "context_ls", "context_rm", "context_use", "create", "debug",
    "DEFAULT_JOB_PATH", "exec_on_job", "get_or_create", "info", "kill", "kill_and_confirm",
    "load_current_job", "MONARCH_DIR", "server_ready", "shell_on_job", "torchx_runner",
]

logger: logging.Logger = logging.getLogger(__name__)

#: The folder of a working directory's contexts, and the link to the active context's state.
MONARCH_DIR: str = ".monarch"
DEFAULT_JOB_PATH: str = f"{MONARCH_DIR}/job_state.pkl"
_CONTEXT_STATE_FILE: str = "state.pkl"
_CONTEXT_SPEC_FILE: str = "spec"
#: Folders of .monarch/ that are monarch's own, not contexts (its job folders, saved specs, markers, logs).
_NOT_CONTEXTS = frozenset({"jobs", "specs", "contexts", "logs"})

TIMEOUT_AFTER_KILL = 300  # seconds kill_and_confirm waits for a terminal state (Monarch's)


# -- contexts ---------------------------------------------------------------------------------


def _context_dir(name: str) -> Path:
    return Path(MONARCH_DIR) / name


def _context_state(name: str) -> Path:
    return _context_dir(name) / _CONTEXT_STATE_FILE


def _check_context_name(name: str) -> str:
    from monarch._workbench.state import StatePaths

    StatePaths(os.getcwd()).check_name(name)  # StateError: one line, letters, digits, '.', '_' or '-'
    if name in _NOT_CONTEXTS:
        from monarch.errors import StateError

        raise StateError(f"context name {name!r} is taken by monarch's own folder .monarch/{name}",
                         "choose another name")
    return name


def _private_monarch_dir() -> None:
    from monarch._workbench.state import private

    private(os.path.abspath(MONARCH_DIR))  # 0700, this user's: it holds reservations and keys


def _current_context() -> Optional[str]:
    """The active context: the folder ``.monarch/job_state.pkl`` links into, or None (no link)."""
    link = Path(DEFAULT_JOB_PATH)
    if not link.is_symlink():
        return None
    target = Path(os.readlink(link))
    if len(target.parts) >= 2 and target.parts[-1] == _CONTEXT_STATE_FILE:
        return target.parts[0]
    return None


def _link_to(name: str) -> None:
    """Make ``.monarch/job_state.pkl`` a (relative) link to ``NAME/state.pkl``, in one step."""
    from monarch._workbench.state import DEFAULT_CONTEXT, StatePaths

    link = Path(DEFAULT_JOB_PATH)
    tmp = Path(MONARCH_DIR) / f".job_state.pkl.{uuid.uuid4().hex[:8]}"
    tmp.symlink_to(Path(name) / _CONTEXT_STATE_FILE)
    os.replace(tmp, link)
    # monarch's own context choice (`monarch context use`) must not hide the link from job.state().
    paths = StatePaths(os.getcwd())
    if paths.current() != DEFAULT_CONTEXT:
        paths.set_current(DEFAULT_CONTEXT)


def _ensure_symlink_setup() -> None:
    """``.monarch/job_state.pkl`` as a link: a plain state file there becomes the ``default`` context's."""
    _private_monarch_dir()
    link = Path(DEFAULT_JOB_PATH)
    if link.is_symlink():
        return
    default_dir = _context_dir("default")
    default_dir.mkdir(exist_ok=True)
    if link.exists():
        os.replace(link, default_dir / _CONTEXT_STATE_FILE)
    _link_to("default")


def context_create(name: str) -> None:
    """Create the context ``name`` (a folder of ``.monarch/``) without switching to it."""
    _check_context_name(name)
    _private_monarch_dir()
    _context_dir(name).mkdir(exist_ok=True)
    print(f"Created context '{name}'")


def context_use(name: str) -> None:
    """Make ``name`` the active context (created if new): ``job_state.pkl`` links to its state."""
    _check_context_name(name)
    _ensure_symlink_setup()
    _context_dir(name).mkdir(exist_ok=True)
    _link_to(name)
    print(f"Switched to context '{name}'")


def context_rm(name: str) -> None:
    """Remove the context ``name``, releasing its job if it runs; the link goes back to ``default``."""
    _check_context_name(name)
    state_file = _context_state(name)
    if state_file.exists():
        try:
            _kill_state_file(state_file)
        except Exception as e:  # the folder goes anyway: say why the job could not be released
            print(f"monarch: releasing the job of context '{name}' failed: {e}", file=sys.stderr)
    shutil.rmtree(_context_dir(name), ignore_errors=True)
    if _current_context() == name:
        _link_to("default")
    print(f"Removed context '{name}'")


def context_ls() -> None:
    """List the contexts of this directory; ``*`` marks the active one."""
    root = Path(MONARCH_DIR)
    names = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.is_symlink()
                   and d.name not in _NOT_CONTEXTS and not d.name.startswith(".")) if root.is_dir() else []
    if not names:
        print("No contexts.")
        return
    current = _current_context()
    for name in names:
        print(f"{'* ' if name == current else '  '}{name}")


def _spec_file() -> Path:
    return _context_dir(_current_context() or "default") / _CONTEXT_SPEC_FILE


def _import_job(module_path: str) -> "JobTrait":
    from monarch.job.job import job_at

    return job_at(module_path)


def set_current_job(module_path: str) -> None:
    """Save ``module.attr`` as the active context's spec (the job ``apply_job()`` applies)."""
    _import_job(module_path)  # only a path that names a job is saved
    _ensure_symlink_setup()
    spec = _spec_file()
    spec.parent.mkdir(exist_ok=True)
    from monarch._workbench.state import write_atomic

    write_atomic(str(spec.absolute()), module_path.encode())


def load_current_job() -> "JobTrait":
    """A fresh job object from the active context's spec (not connected: ``.state()`` connects it).

    A context applied by our own ``monarch apply`` (no Monarch-layout spec) is found too.
    Raises ``FileNotFoundError`` when the context has no spec.
    """
    spec = _spec_file()
    if spec.exists():
        return _import_job(spec.read_text().strip())
    from monarch.job.job import load_current_job as ours

    return ours()


# -- apply / exec / shell / kill ----------------------------------------------------------------


def _without_gather(job: "JobTrait") -> list:
    """Take the job's gather mounts off it (they are served by the context's mount process); returns them."""
    specs = list(getattr(job, "_mount_specs", []) or [])
    job._mount_specs = [s for s in specs if s[0] != "gather"]
    return [s for s in specs if s[0] == "gather"]


@contextlib.contextmanager
def _connected(job: "JobTrait") -> Iterator[Any]:
    """``job.state()`` (reusing the context's live reservation, applying it otherwise) for the time of
    one command: its remote mounts are opened or refreshed on the hosts for it (only changes
    travel) and closed when it ends, before this process exits, so no unmount is left racing a
    ``kill``; its gather mounts are left to the context's mount process."""
    gathers = _without_gather(job)
    try:
        state = job.state()
        try:
            yield state
        finally:
            try:
                job.close_mounts()
            except Exception as e:  # a host that went away: nothing left to unmount there
                print(f"monarch: closing the job's remote mounts: {e}", file=sys.stderr)
    finally:
        job._mount_specs = [*job._mount_specs, *gathers]


def _state_path(job: "JobTrait") -> Optional[str]:
    running = job._running
    return getattr(running, "path", None) if running is not None else None


def apply_job(module_path: Optional[str] = None) -> None:
    """Apply the job ``module_path`` (``module.attr``; default: the active context's saved spec) and
    wait until its hosts run commands: "Job is ready (N s)".

    A live reservation of the context that can run the job is reused.  The job's gather mounts are
    served here until the reservation is released (its remote mounts are mounted for each command).
    """
    from monarch.tools import _mount_process

    if module_path is not None:
        set_current_job(module_path)
    job = load_current_job()
    t0 = time.time()
    gathers = [s for s in getattr(job, "_mount_specs", []) if s[0] == "gather"]
    with _connected(job) as state:
        path = _state_path(job)
        if path is not None:
            _mount_process.ensure(path, gathers)
        _ready_check(state)
    print(f"Job is ready ({time.time() - t0:.0f}s)", flush=True)


def _ready_check(state: Any) -> None:
    """Every host of the first mesh runs ``true`` (Monarch's readiness check)."""
    from monarch.job import exec_command

    mesh = next(iter(state._hosts.values()))
    rc = exec_command(mesh, ["true"]).get()
    if rc != 0:
        raise RuntimeError(f"the readiness check (`true` on every host) exited {rc}")


def _parse_env(env: Optional[list[str]]) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"Invalid env var (expected KEY=VALUE): {item!r}")
        result[key] = value
    return result


def _read_script(script: Optional[str]) -> Optional[str]:
    if script is None:
        return None
    if script == "-":
        return sys.stdin.read()
    with open(script) as f:
        return f.read()


def _parse_point(s: str) -> dict[str, int]:
    point: dict[str, int] = {}
    for pair in s.split(","):
        key, sep, value = pair.partition("=")
        try:
            point[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"a point is DIM=N,DIM=N (e.g. hosts=1), got {s!r}") from None
        if not sep or not key.strip():
            raise ValueError(f"a point is DIM=N,DIM=N (e.g. hosts=1), got {s!r}")
    return point


def _output_dir_for_job(mount_specs: list) -> tuple[str, str]:
    """Where ``--all``/``--mesh`` write each rank's output on the hosts, and the line that says so:
    under the job's first gather mount (so the files show here), else ``/tmp`` of each host."""
    run_id = uuid.uuid4().hex[:8]
    for kind, remote, local, _meshes in mount_specs:
        if kind == "gather" and isinstance(remote, str):
            report = (f"Output → {local}/<rank>/exec_outputs/{run_id}/\n"
                      f"  e.g. {local}/hosts_0/exec_outputs/{run_id}/stdout.txt")
            return os.path.join(remote, "exec_outputs", run_id), report
    output_dir = f"/tmp/monarch_exec_{run_id}/$SUBDIR"
    return output_dir, f"Output → /tmp/monarch_exec_{run_id}/<rank>/ on each worker"


def _kill_job(job: "JobTrait") -> None:
    job.kill()


def exec_on_job(cmd: list[str], run_all: bool = False, mesh_name: Optional[str] = None,
                point_str: Optional[str] = None, env: Optional[list[str]] = None, workdir: Optional[str] = None,
                kill: bool = False, script: Optional[str] = None,
                per_host: Optional[dict[str, int]] = None) -> int:
    """Run ``cmd`` on the active context's job (applied first if it is not running); returns the
    highest exit code of the targeted ranks.

    Targeting: ``run_all`` (every rank of every mesh) or ``mesh_name`` (every rank of that mesh)
    write each rank's output to files on the hosts and print where; ``point_str`` (``"hosts=1"``,
    one coordinate of the first mesh) or neither (rank 0 of the first mesh) stream it here.
    ``script`` (a file, ``-`` for stdin) runs under bash instead of ``cmd``; ``kill`` releases the
    job afterwards.
    """
    from monarch.job import exec_command

    job = load_current_job()
    script_text = _read_script(script)
    if script_text is not None:
        cmd = ["bash", "-c", script_text]
    if not cmd:
        raise ValueError("no command specified (use cmd args or --script)")
    env_dict = _parse_env(env)
    mount_specs = list(getattr(job, "_mount_specs", []) or [])
    worst = 0
    try:
        with _connected(job) as state:
            meshes = state._hosts
            if not meshes:
                raise RuntimeError("Job has no host meshes")
            first = next(iter(meshes))
            rank: Optional[int] = None
            point: Optional[dict[str, int]] = None
            if run_all:
                targets = list(meshes.items())
            elif mesh_name is not None:
                if mesh_name not in meshes:
                    raise ValueError(f"Mesh {mesh_name!r} not found. Available: {list(meshes)}")
                targets = [(mesh_name, meshes[mesh_name])]
            elif point_str is not None:
                point = _parse_point(point_str)
                targets = [(first, meshes[first])]
            else:
                rank = 0
                targets = [(first, meshes[first])]
            output_dir: Optional[str] = None
            if run_all or mesh_name is not None:
                output_dir, report = _output_dir_for_job(mount_specs)
                print(report, flush=True)
            for _name, mesh in targets:
                rc = exec_command(mesh, list(cmd), env=env_dict, workdir=workdir, output_dir=output_dir,
                                  rank=rank, point=point, per_host=per_host).get()
                worst = max(worst, rc)
    finally:
        if kill:
            _kill_job(job)
    return worst


def shell_on_job(mesh_name: Optional[str] = None, point_str: Optional[str] = None,
                 env: Optional[list[str]] = None, workdir: Optional[str] = None, kill: bool = False) -> int:
    """An interactive shell on one host of the active context's job (default: rank 0 of the first
    mesh; ``point_str`` picks a coordinate); returns the shell's exit status."""
    from monarch.job import shell

    job = load_current_job()
    try:
        with _connected(job) as state:
            meshes = state._hosts
            if not meshes:
                raise RuntimeError("Job has no host meshes")
            if mesh_name is None:
                mesh_name = next(iter(meshes))
            elif mesh_name not in meshes:
                raise ValueError(f"Mesh {mesh_name!r} not found. Available: {list(meshes)}")
            mesh = meshes[mesh_name]
            one = mesh.slice(**_parse_point(point_str)) if point_str is not None else type(mesh)([mesh.hosts[0]])
            return shell(one, env=_parse_env(env), workdir=workdir)
    finally:
        if kill:
            _kill_job(job)


def _kill_state_file(state_file: Path) -> None:
    """Release the job saved at ``state_file`` and remove the file (and stop its mount process)."""
    from monarch.job import job_load
    from monarch.tools import _mount_process

    path = os.path.realpath(state_file)
    _mount_process.stop(path)
    try:
        job_load(path).kill()
    finally:
        Path(path).unlink(missing_ok=True)


def kill_context(name: Optional[str] = None) -> str:
    """Release the job of context ``name`` (default: the active one); returns what was killed.

    Raises ``FileNotFoundError`` when there is no job to kill."""
    name = name or _current_context()
    if name is not None:
        _check_context_name(name)
        state_file = _context_state(name)
        if state_file.exists():
            _kill_state_file(state_file)
            return f"Killed context '{name}'"
    from monarch._workbench.state import StatePaths

    path = StatePaths(os.getcwd()).resolve(None)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no job to kill in {os.path.relpath(path)}")
    _kill_state_file(Path(path))
    return "Killed job"


def debug(host: str, port: Union[int, str]) -> None:
    """Connect to a debug server at ``host:port`` with netcat (Monarch's ``debug --host --port``)."""
    for cmd in ("ncat", "nc", "netcat"):
        try:
            subprocess.run([cmd, str(host), str(port)], check=True)
            return
        except FileNotFoundError:
            continue
    logger.error("Could not find a suitable netcat binary. Please install one and try again.")


# -- TorchX servers ----------------------------------------------------------------------------


def _default_name() -> str:
    return f"monarch-{getpass.getuser()}"


def torchx_runner() -> "Runner":
    """A TorchX ``Runner`` with ``monarch.tools.config.defaults``' schedulers (use it as a context manager)."""
    from monarch.tools.config import defaults
    from torchx.runner import Runner

    return Runner(_SESSION, defaults.scheduler_factories())


#: The TorchX session name of our handles (``slurm://monarch/123``).  Monarch's is empty
#: (``slurm:///123``), which TorchX 0.7.0, the one we install, cannot parse back.
_SESSION = "monarch"


def _handle(server_handle: str) -> str:
    """``server_handle`` as TorchX 0.7.0 parses it: Monarch's ``scheduler:///app`` gets our session name."""
    scheduler, sep, rest = server_handle.partition("://")
    if sep and rest.startswith("/"):
        return f"{scheduler}://{_SESSION}{rest}"
    return server_handle


def create(config: "Config", name: Optional[str] = None) -> Union[str, "AppDryRunInfo"]:
    """Submit ``config.appdef`` to ``config.scheduler`` as job ``name`` (default ``monarch-$USER``).

    Returns the server handle (``scheduler:///app_id``), or with ``config.dryrun`` the
    ``AppDryRunInfo`` of what would be submitted.  The workspace's folders are merged into one that
    TorchX ships with the job, and its ``WORKSPACE_DIR``/``$env`` variables set on every role.
    """
    from monarch.tools.config import defaults
    from monarch.tools.utils import MONARCH_HOME
    from torchx.specs import AppDef

    name = name or _default_name()
    os.environ.setdefault("TORCHX_CONTEXT_NAME", "monarch")
    with torchx_runner() as runner:
        appdef = AppDef(name, config.appdef.roles, config.appdef.metadata)
        if not config.workspace.dirs and not config.workspace.env:
            dryrun = runner.dryrun(appdef, config.scheduler, config.scheduler_args, workspace=None)
        else:
            with tempfile.TemporaryDirectory(dir=MONARCH_HOME("out")) as tmp:
                merged = Path(tmp) / "workspace"
                config.workspace.merge(merged)
                config.workspace.set_env_vars(appdef)
                dryrun = runner.dryrun(appdef, config.scheduler, config.scheduler_args, str(merged))
        if config.dryrun:
            dryrun._fmt = defaults.dryrun_info_formatter(dryrun)
            return dryrun
        return runner.schedule(dryrun)


def info(server_handle: str) -> Optional["ServerSpec"]:
    """The server's ``ServerSpec`` from its scheduler, or None when the scheduler does not know it
    (a typo, or a job that ended long ago).  Hostnames are filled in once the meshes run."""
    from monarch.tools.mesh_spec import ServerSpec, mesh_spec_from_metadata
    from torchx.specs import parse_app_handle

    server_handle = _handle(server_handle)
    with torchx_runner() as runner:
        status = runner.status(server_handle)
        if status is None:
            return None
        appdef = runner.describe(server_handle)
        if appdef is None:
            return None
    replicas = {r.role: r.replicas for r in status.roles}
    meshes = []
    for role in appdef.roles:
        spec = mesh_spec_from_metadata(appdef, role.name)
        assert spec is not None  # every role of the appdef has a mesh
        hosts = replicas.get(role.name)
        if hosts:  # some schedulers do not report replicas
            spec.hostnames = [h.hostname for h in sorted(hosts, key=lambda h: h.id)]
            spec.state = min(h.state for h in hosts)  # the least advanced replica's
        meshes.append(spec)
    scheduler, namespace, _ = parse_app_handle(server_handle)
    return ServerSpec(name=appdef.name, state=status.state, meshes=meshes, scheduler=scheduler,
                      namespace=namespace, ui_url=status.ui_url, metadata=appdef.metadata)


_5_SECONDS = timedelta(seconds=5)


async def server_ready(server_handle: str, check_interval: timedelta = _5_SECONDS) -> Optional["ServerSpec"]:
    """Wait until the server and all its meshes run (or it ends); its ``ServerSpec``, None if unknown."""
    from torchx.specs import AppState
    from torchx.specs.api import is_terminal

    interval = check_interval.total_seconds()
    start = datetime.now()
    while True:
        spec = info(server_handle)
        if spec is None:
            return None
        waiting = None
        if spec.state <= AppState.PENDING:
            waiting = f"{server_handle} to be {AppState.RUNNING} (current: {spec.state})"
        elif spec.state == AppState.RUNNING:
            pending = [m for m in spec.meshes if m.state <= AppState.PENDING]
            if not pending:
                return spec
            waiting = f"mesh {pending[0].name} of {server_handle} to be {AppState.RUNNING} (current: {pending[0].state})"
        elif is_terminal(spec.state):
            return spec
        else:
            waiting = f"{server_handle} (in state {spec.state})"
        print(f"Waiting for {waiting}; checking again in {interval} s. Total wait time: {datetime.now() - start}",
              end="\r")
        await asyncio.sleep(interval)


async def get_or_create(name: str, config: "Config", check_interval: timedelta = _5_SECONDS,
                        force_restart: bool = False) -> "ServerSpec":
    """The running server ``name`` on ``config.scheduler``, created from ``config`` (and waited for)
    when there is none running; ``force_restart`` kills and re-creates a running one."""
    assert not config.dryrun, "dryrun is not supported for get_or_create(), for dryrun use the create() API instead"
    handle = f"{config.scheduler}:///{name}"
    spec = await server_ready(handle, check_interval)
    if spec is None or not spec.is_running:
        logger.info("no existing RUNNING server `%s` creating new one...", handle)
        new_handle = str(create(config, name))
        spec = await server_ready(new_handle, check_interval)
        if spec is None:
            raise RuntimeError(f"the new server `{new_handle}` went missing (should never happen)")
        if not spec.is_running:
            raise RuntimeError(f"the new server `{new_handle}` has {spec.state}")
        print(f"{CYAN}New job `{new_handle}` is ready to serve.{ENDC}")
    else:
        print(f"{CYAN}Found existing job `{handle}` ready to serve.{ENDC}")
        if force_restart:
            print(f"{CYAN}force_restart=True, restarting `{handle}`.{ENDC}")
            kill(handle)
            spec = await get_or_create(name, config, check_interval)
    if spec.ui_url:
        print(f"{CYAN}Job URL: {spec.ui_url}{ENDC}")
    return spec


def kill(server_handle: str) -> None:
    """Cancel the server's job (asynchronous: see ``kill_and_confirm``)."""
    with torchx_runner() as runner:
        runner.cancel(_handle(server_handle))


def kill_and_confirm(server_handle: str, timeout_after_kill: int = TIMEOUT_AFTER_KILL) -> None:
    """Cancel the server's job and wait until its scheduler reports it ended; raises after
    ``timeout_after_kill`` seconds without that.  Any terminal state counts, CANCELLED too (the
    state a cancelled Slurm job ends in), and so does a job the scheduler no longer lists (Monarch
    waits for SUCCEEDED or FAILED only)."""
    from torchx.specs.api import is_terminal

    server_handle = _handle(server_handle)
    with torchx_runner() as runner:
        runner.cancel(server_handle)
        deadline = time.monotonic() + timeout_after_kill
        while time.monotonic() < deadline:
            status = runner.status(server_handle)
            # A job its scheduler no longer lists after the cancel has ended too.
            if status is None or is_terminal(status.state):
                logger.info("Server %s reached %s state!", server_handle, status.state if status else "an unlisted")
                return
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    raise Exception(f"Server {server_handle} did not reach a terminal state within {timeout_after_kill} "
                    "seconds after kill")
