"""The job state file: what ``monarch serve`` reserved, so later commands reuse it.

One :class:`JobRecord` per reservation, pickled (as a versioned plain dict, so a
new monarch can refuse an old file cleanly) to ``.monarch/job_state.pkl`` in
the working directory, mode 0600, written atomically.  Named contexts live
beside it (``.monarch/<name>.job_state.pkl``); ``.monarch/current`` names the
context in use; ``MONARCH_JOB`` points at a state file anywhere.
:class:`StatePaths` names every file under ``.monarch/``.

Live sockets are never stored: addresses and keys are, and connections are
reopened after load.
"""

from __future__ import annotations

import os
import pickle
import re
import stat
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from monarch_agents.files import UnsafeFolder, check_private, private_dir, write_atomic  # noqa: F401  (re-exported for the engine's modules)
from monarch_agents.keys import JobKeys
from monarch.errors import StateError
# They type the scheduler interface, so they live with it; the state file is made of them.
from monarch_schedulers.base import HostRecord, JobSpec  # noqa: F401  (re-exported)

STATE_FORMAT = "monarch-job-state"
STATE_VERSION = 1
DEFAULT_CONTEXT = "default"
#: A context's state file in PyTorch Monarch's layout (``.monarch/NAME/state.pkl``, which
#: ``python -m monarch.tools.cli context`` keeps), beside ours (``.monarch/NAME.job_state.pkl``).
MONARCH_CONTEXT_STATE = "state.pkl"
_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: "$" would let "name\n" through




@dataclass
class JobRecord:
    """A reservation: scheduler, job id, hosts with agent addresses, keys, and the spec."""

    name: str
    spec: JobSpec
    job_id: str
    job_dir: str
    keys: JobKeys
    hosts: list[HostRecord] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    version: int = STATE_VERSION
    #: The SPMD program ``monarch.job.spmd.serve`` reserved for (argv, env, ...), so that
    #: ``job_load(...).run_spmd()`` in another process runs it again; None for ``monarch serve``.
    program: dict | None = None
    #: The ``monarch.job`` job object (``ProcessJob``, ``SlurmJob``, a user's ``JobTrait``) this
    #: reservation was made for, pickled without its running state, so ``job_load`` gives it back;
    #: None when ``monarch serve`` made it.
    job: bytes | None = None
    #: What ``monarch serve --workspace`` syncs to every host (``monarch._workbench.workspace.WorkspaceSpec``
    #: fields); None when the hosts use the client's paths as they are.
    workspace: dict | None = None
    #: The wire version (``monarch_agents.wire.VERSION``) of the monarch that served this reservation:
    #: its host agents drop the messages of another version unread, so a command of a monarch updated
    #: since would wait for answers that never come.  None: served before it was recorded.
    wire: int | None = None

    @property
    def ready(self) -> bool:
        return len(self.hosts) == self.spec.hosts

    @property
    def route(self) -> dict | None:
        """How this machine reaches the agents when not at their addresses (a Kubernetes reservation
        behind a port-forward: ``monarch_agents.client.ensure_runtime``'s ``route``); None: directly.

        Read from the job's folder each time: a port-forward restarted by ``monarch status`` listens
        on a new port."""
        from monarch_schedulers.agent_launch import read_route

        return read_route(self.job_dir)

    @property
    def agent_addrs(self) -> list[str]:
        """The host agents' addresses, in host rank order."""
        return [h.addr for h in sorted(self.hosts, key=lambda h: h.host_rank)]

    def runtime(self) -> Any:
        """This process's runtime (``monarch_agents.runtime.Runtime``), started on first use to talk to
        this reservation's hosts: with its keys, listening where they can answer, by its route."""
        from monarch_agents.client import ensure_runtime
        from monarch_agents.wire import VERSION

        if self.wire is not None and self.wire != VERSION:
            raise StateError(f"reservation {self.name!r} was served by a monarch whose host agents speak wire "
                             f"version {self.wire}; this monarch speaks {VERSION} (it was updated since `monarch serve`)",
                             "`monarch stop" + ("" if self.name == DEFAULT_CONTEXT else f" --name {self.name}")
                             + "` releases it, then `monarch serve` again")
        return ensure_runtime(self.keys, reach=self.agent_addrs, route=self.route)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["keys"] = self.keys.as_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "JobRecord":
        return cls(
            name=d["name"], spec=JobSpec(**d["spec"]), job_id=d["job_id"], job_dir=d["job_dir"],
            keys=JobKeys(**d["keys"]), hosts=[HostRecord(**h) for h in d["hosts"]],
            created_at=d["created_at"], version=d["version"], program=d.get("program"), job=d.get("job"),
            workspace=d.get("workspace"), wire=d.get("wire"),
        )


class StatePaths:
    """Names every file under ``.monarch/``.

    ``StatePaths()`` uses the nearest ``.monarch/`` holding a reservation, in the working directory
    or above it (as git finds its repository), else the working directory's; ``StatePaths(dir)``
    uses ``dir/.monarch`` exactly.
    """

    def __init__(self, root: str | None = None):
        self.root = os.path.abspath(os.path.join(root, ".monarch")) if root else find_state_dir(os.getcwd())

    def check_name(self, name: str) -> str:
        if not _NAME_RE.match(name):
            raise StateError(f"bad context name {name!r}", "use letters, digits, '.', '_' or '-'")
        return name

    def state_file(self, name: str) -> str:
        self.check_name(name)
        if name == DEFAULT_CONTEXT:
            return os.path.join(self.root, "job_state.pkl")
        return os.path.join(self.root, f"{name}.job_state.pkl")

    def job_dir(self, name: str) -> str:
        return os.path.join(self.root, "jobs", self.check_name(name))

    @property
    def current_file(self) -> str:
        return os.path.join(self.root, "current")

    def current(self) -> str:
        try:
            with open(self.current_file) as f:
                name = f.read().strip()
            return name or DEFAULT_CONTEXT
        except FileNotFoundError:
            return DEFAULT_CONTEXT

    def set_current(self, name: str) -> None:
        private(self.root)
        write_atomic(self.current_file, (self.check_name(name) + "\n").encode())

    def contexts(self) -> list[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        out = []
        for n in sorted(names):
            if n == "job_state.pkl":
                out.append(DEFAULT_CONTEXT)
            elif n.endswith(".job_state.pkl"):
                out.append(n[: -len(".job_state.pkl")])
        return out

    def resolve(self, name: str | None = None) -> str:
        """The state file a command should use: MONARCH_JOB, then --name, then the current context."""
        env = os.environ.get("MONARCH_JOB")
        if env and name is None:
            return os.path.abspath(env)
        return self.followed(self.state_file(name or self.current()))

    def followed(self, path: str) -> str:
        """``path``, or where it links to when it is a link to a file of this ``.monarch/``.

        PyTorch Monarch's contexts (``python -m monarch.tools.cli context use NAME``) make
        ``job_state.pkl`` a link to ``NAME/state.pkl``: the state is written to the file itself
        (an atomic write over the link would replace the link).  A link leading out of
        ``.monarch/`` is not followed."""
        if not os.path.islink(path):
            return path
        target = os.path.realpath(path)
        return target if target.startswith(os.path.realpath(self.root) + os.sep) else path


def _holds_reservation(d: str) -> bool:
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return any(n == "current" or n.endswith("job_state.pkl") for n in names)


def find_state_dir(start: str) -> str:
    """The nearest ``.monarch/`` with a reservation in ``start`` or a parent; else ``start/.monarch``.

    A ``.monarch/`` holding only logs (``~/.monarch/logs`` of scripts run without a reservation)
    does not count.  As git's GIT_CEILING_DIRECTORIES, ``MONARCH_CEILING_DIRECTORIES`` (paths
    separated by ':') names folders the search does not enter or pass.

    As git's ``safe.directory`` rule, a ``.monarch/`` that is not this user's alone (another user's, a
    link, or writable by group or others) is never used: the search stops there and falls back to
    ``start/.monarch``, and a command that then finds no reservation says which folder was refused
    and why (:func:`missing_state`).  Another user could otherwise put keys of theirs, or a state
    file naming their agents, above your project.
    """
    here = os.path.abspath(start)
    ceilings = {os.path.abspath(p) for p in os.environ.get("MONARCH_CEILING_DIRECTORIES", "").split(os.pathsep) if p}
    d = here
    while True:
        candidate = os.path.join(d, ".monarch")
        if _holds_reservation(candidate):
            try:
                check_private(candidate, tighten=False)
            except UnsafeFolder as e:
                if d == here:
                    raise StateError(f"refusing {candidate}: {_after_path(e.message, candidate)}", e.hint) from None
                _REFUSED[os.path.join(here, ".monarch")] = (candidate, e)
                return os.path.join(here, ".monarch")
            if stat.S_IMODE(os.lstat(candidate).st_mode) & 0o077:
                check_private(candidate)  # ours, readable by others: made 0700
            return candidate
        parent = os.path.dirname(d)
        if parent == d or parent in ceilings:
            return os.path.join(here, ".monarch")
        d = parent


#: ``.monarch/`` folders the search refused, by the folder it fell back to (for :func:`missing_state`).
_REFUSED: dict[str, tuple[str, UnsafeFolder]] = {}


def _after_path(message: str, path: str) -> str:
    return message[len(path) + 1:] if message.startswith(path + " ") else message


def save_state(path: str, state: JobRecord) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(folder) == ".monarch":  # ours; a MONARCH_JOB file elsewhere is in the user's folder
        private(folder)
    write_atomic(path, state_bytes(state))


def private(folder: str, top: str | None = None) -> str:
    """``folder`` made or checked private (``monarch_rdmafs.private``), as a StateError naming the fix."""
    try:
        return private_dir(folder, top)
    except UnsafeFolder as e:
        raise StateError(e.message, e.hint) from None


def make_job_dir(job_dir: str) -> str:
    """A fresh, private job folder (``.monarch/jobs/<name>/`` with its ``agents/``): what a reservation
    before it left there is removed, and ``.monarch/`` and ``jobs/`` must be this user's alone."""
    import shutil

    jobs = os.path.dirname(os.path.abspath(job_dir))
    top = os.path.dirname(jobs) if os.path.basename(jobs) == "jobs" else jobs
    private(jobs, top)  # checked before anything in it is removed or written
    shutil.rmtree(job_dir, ignore_errors=True)
    private(os.path.join(job_dir, "agents"), top)
    return job_dir


def state_bytes(state: JobRecord | None, job: bytes | None = None, kind: str | None = None) -> bytes:
    """A state file's bytes: a reservation, and/or (for a job with no reservation) the pickled job."""
    payload: dict[str, Any] = {"format": STATE_FORMAT, "version": STATE_VERSION,
                               "state": state.to_dict() if state is not None else None}
    if job is not None:
        payload["job"] = job
        payload["kind"] = kind
    return pickle.dumps(payload, protocol=5)


def load_state(path: str) -> JobRecord:
    """Load a state file; raises StateError (with the fixing command) if it is missing or unusable."""
    payload = load_payload(path)
    if payload.get("state") is None:
        raise StateError(f"{_rel(path)} holds a {payload.get('kind') or 'Python'} job with no monarch reservation",
                         "load it with monarch.job.job_load(), or `monarch serve` to reserve hosts")
    try:
        return JobRecord.from_dict(payload["state"])
    except Exception:
        raise StateError(f"state file {_rel(path)} is corrupt",
                         "remove it with `monarch stop --force`, then `monarch serve`") from None


def load_payload(path: str) -> dict:
    """The checked top level of a state file: ``state`` (a reservation) and/or ``job`` (a pickled job)."""
    try:
        with open(path, "rb") as f:
            _check_private(path, os.fstat(f.fileno()))
            raw = f.read()
    except FileNotFoundError:
        raise missing_state(path) from None
    except OSError as e:
        raise StateError(f"cannot read {_rel(path)}: {e.strerror}", "check its permissions") from None
    return parse_payload(raw, _rel(path))


def parse_payload(raw: bytes, where: str) -> dict:
    """Check the bytes of a state file (``where`` names it in errors)."""
    try:
        payload = pickle.loads(raw)
    except (ModuleNotFoundError, AttributeError) as e:
        # A pickle of classes this monarch does not have: PyTorch Monarch's own job pickle, or another program's.
        raise StateError(f"{where} is not a monarch state file (it needs {_missing(e)})",
                         f"it was written by another program or another monarch; remove it (`rm {where}`)") from None
    except Exception:
        raise StateError(f"state file {where} is corrupt",
                         f"remove it with `monarch stop --force` or `rm {where}`, then `monarch serve`") from None
    if not isinstance(payload, dict) or payload.get("format") != STATE_FORMAT:
        raise StateError(f"{where} is not a monarch state file", f"remove it (`rm {where}`), then `monarch serve`")
    if payload.get("version") != STATE_VERSION:
        raise StateError(f"state file {where} is version {payload.get('version')}, this monarch reads {STATE_VERSION}",
                         "run `monarch stop --force` with the monarch that made it, or remove the file, then `monarch serve`")
    return payload


def _missing(e: Exception) -> str:
    name = getattr(e, "name", None)
    return f"module {name!r}" if isinstance(e, ModuleNotFoundError) and name else str(e)


class StateFileWarning(UserWarning):
    """A state file was readable by others; it has been made private."""


def _check_private(path: str, st: os.stat_result) -> None:
    """A state file holds the job's keys: another user's is refused, a loose mode is fixed (with a warning)."""
    import stat
    import warnings

    if st.st_uid != os.getuid():
        raise StateError(f"{_rel(path)} belongs to another user (uid {st.st_uid})",
                         "use your own reservation: `monarch serve` in a folder of yours")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        try:
            os.chmod(path, 0o600)
        except OSError as e:
            raise StateError(f"{_rel(path)} is readable by others (mode {mode:o}) and cannot be made private: {e.strerror}",
                             f"`chmod 600 {_rel(path)}`") from None
        warnings.warn(f"{_rel(path)} was readable by others (mode {mode:o}; it holds the job's keys): made it 0600",
                      StateFileWarning, stacklevel=3)


def context_of(path: str) -> str:
    """The context name a state file belongs to (``job_state.pkl`` is the default one)."""
    base = os.path.basename(path)
    if base == MONARCH_CONTEXT_STATE:  # PyTorch Monarch's layout: .monarch/NAME/state.pkl
        return os.path.basename(os.path.dirname(os.path.abspath(path)))
    return DEFAULT_CONTEXT if base == "job_state.pkl" else base[: -len(".job_state.pkl")]


def missing_state(path: str) -> StateError:
    """No reservation at ``path``: the error names the reservations that are there, and how to switch."""
    name = context_of(path)
    refused = _REFUSED.get(os.path.dirname(os.path.abspath(path)))
    if refused is not None:
        folder, e = refused
        return StateError(f"no reservation here; {folder} above was not used: {_after_path(e.message, folder)}",
                          f"`monarch serve` here makes your own; or {e.hint}; MONARCH_CEILING_DIRECTORIES="
                          f"{os.path.dirname(folder)} stops the search below it")
    others = [n for n in StatePaths(os.path.dirname(os.path.dirname(path))).contexts() if n != name] \
        if os.path.basename(os.path.dirname(path)) == ".monarch" else []
    flag = "" if name == DEFAULT_CONTEXT else f" --name {name}"
    if not others:
        return StateError(f"no reservation {name!r} here ({_rel(path)})", f"run `monarch serve{flag}` first")
    listed = ", ".join(repr(o) for o in others)
    return StateError(f"no reservation {name!r} here; reservations here: {listed}",
                      f"`monarch context use {others[0]}` switches to {others[0]!r} (or `--name {others[0]}`); "
                      f"`monarch serve{flag}` makes {name!r}")


def remove_state(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("..") else path
    except ValueError:
        return path
