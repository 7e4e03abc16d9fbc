"""monarch.job.spmd: reserve hosts for a torchrun program once, run it many times.

    from monarch.job.spmd import serve

    job = serve(["torchrun", "--nproc-per-node=2", "train.py"], scheduler="local_cwd")
    job.run_spmd()            # torchrun on every reserved host, output streamed here
    job.run_spmd()            # again: the same hosts and agents, no new allocation

    # later, from another process (or after editing train.py):
    from monarch.job.spmd import job_load
    job_load(".monarch/job_state.pkl").run_spmd()

``serve`` takes a torchrun command or a TorchX ``AppDef`` (one role: its
``num_replicas`` is the number of hosts, its entrypoint and args the command).
Multi-node works with either: ``--nnodes=2`` in a command reserves two hosts,
and each host's torchrun gets the rendezvous through the environment
(``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``PET_*``), as with
``monarch run``.  It reuses a live reservation of the same shape (so a script
that calls ``serve`` on every start reserves once), and refuses to replace one
of another shape unless asked (``replace=True``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from monarch.errors import RunFailed, UsageError
from monarch.job import Job
from monarch._workbench.state import DEFAULT_CONTEXT, JobRecord, JobSpec, StatePaths

#: TorchX scheduler names and what runs them here.
_SCHEDULERS = {"local_cwd": "local", "local": "local", "slurm": "slurm"}
#: The Slurm options a ``scheduler_cfg`` may carry: the names ``monarch serve --scheduler slurm`` uses,
#: which are also TorchX's for the ones TorchX has.
_SLURM_CFG = frozenset({"partition", "time", "account", "qos", "constraint", "exclusive", "gpus_per_node",
                        "sbatch_args", "client_host"})
_TORCHRUN = ("torchrun", "torch.distributed.run")


@dataclass
class SPMDProgram:
    """What ``serve`` was given, as stored in the job state: the command and where it runs."""

    argv: list[str]
    hosts: int = 1
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)
    source: str = "command"  # or "appdef:<name>"
    gpus_per_node: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> "SPMDProgram":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def program_of(appdef_or_command: Any) -> SPMDProgram:
    """Read a torchrun command list or a TorchX AppDef into an :class:`SPMDProgram`."""
    if isinstance(appdef_or_command, (list, tuple)):
        argv = [str(a) for a in appdef_or_command]
        if not argv:
            raise UsageError("serve() needs a command, e.g. ['torchrun', '--nproc-per-node=2', 'train.py']")
        nnodes, nproc, standalone = _torchrun_shape(argv)
        hosts = nnodes or 1
        if standalone and hosts > 1:
            raise UsageError(f"torchrun --standalone runs on one host, but the command asks for --nnodes={hosts}",
                             "drop --standalone: monarch gives each host the rendezvous address")
        return SPMDProgram(argv, hosts=hosts, nproc_per_node=nproc)
    roles = getattr(appdef_or_command, "roles", None)
    if roles is None:
        raise UsageError(f"serve() takes a command list or a TorchX AppDef, not {type(appdef_or_command).__name__}")
    if len(roles) != 1:
        raise UsageError(f"the AppDef {appdef_or_command.name!r} has {len(roles)} roles; an SPMD job has exactly one")
    role = roles[0]
    argv = [role.entrypoint, *role.args] if role.entrypoint and role.entrypoint != "<MISSING>" else list(role.args)
    if not argv:
        raise UsageError(f"role {role.name!r} has no entrypoint or args")
    hosts = int(role.num_replicas or 1)
    nnodes, nproc, _ = _torchrun_shape(argv)
    if nnodes and nnodes != hosts:
        raise UsageError(f"role {role.name!r} has num_replicas={hosts} but its torchrun asks for --nnodes={nnodes}",
                         "make them agree: one host per replica")
    gpus = int(getattr(role.resource, "gpu", 0) or 0) if role.resource is not None else 0
    return SPMDProgram(argv, hosts=hosts, nproc_per_node=nproc, env=dict(role.env or {}),
                       source=f"appdef:{appdef_or_command.name}", gpus_per_node=max(gpus, 0))


def _torchrun_shape(argv: list[str]) -> tuple[int | None, int, bool]:
    """(nnodes or None, nproc_per_node, standalone) of a torchrun command; (None, 1, False) otherwise."""
    args = _torchrun_args(argv)
    if args is None:
        return None, 1, False
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--nnodes")
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    p.add_argument("--standalone", action="store_true")
    known, _ = p.parse_known_args(args)
    nnodes = None
    if known.nnodes is not None:
        lo, _, hi = known.nnodes.partition(":")
        if hi and hi != lo:
            raise UsageError(f"elastic --nnodes={known.nnodes} is not supported", "reserve a fixed number of hosts: --nnodes=N")
        try:
            nnodes = int(lo)
        except ValueError:
            raise UsageError(f"--nnodes={known.nnodes} is not a number of hosts") from None
    try:
        nproc = int(known.nproc_per_node)
    except ValueError:
        nproc = 1  # "gpu", "auto", "cpu": torchrun decides on each host
    return nnodes, nproc, known.standalone


def _torchrun_args(argv: list[str]) -> list[str] | None:
    head = os.path.basename(argv[0])
    if head in _TORCHRUN:
        return argv[1:]
    if head.startswith("python") and len(argv) >= 3 and argv[1] == "-m" and argv[2] in _TORCHRUN:
        return argv[3:]
    return None


def _spec_for(program: SPMDProgram, scheduler: str, scheduler_cfg: dict | None) -> JobSpec:
    backend = _SCHEDULERS.get(scheduler)
    if backend is None:
        raise UsageError(f"unknown scheduler {scheduler!r}", f"choose one of: {', '.join(sorted(_SCHEDULERS))}")
    cfg = dict(scheduler_cfg or {})
    options: dict = {}
    if backend == "slurm":
        unknown = sorted(set(cfg) - _SLURM_CFG)
        if unknown:
            raise UsageError(f"unknown Slurm option {unknown[0]!r} in scheduler_cfg",
                             f"known: {', '.join(sorted(_SLURM_CFG))}")
        options = {k: v for k, v in cfg.items() if v is not None and v is not False}
        if program.gpus_per_node and "gpus_per_node" not in options:
            options["gpus_per_node"] = program.gpus_per_node
    elif cfg:
        raise UsageError(f"scheduler_cfg is for Slurm; {scheduler!r} takes none (got {sorted(cfg)})")
    return JobSpec(backend, program.hosts, program.nproc_per_node, options)


class SPMDJob(Job):
    """A reservation with an SPMD program: ``run_spmd()`` runs it on every host, as often as you like."""

    record: JobRecord  # always made from a reservation (serve() or job_load()), never reserved by itself

    @property
    def program(self) -> SPMDProgram | None:
        return SPMDProgram.from_dict(self.record.program) if self.record.program else None

    def run_spmd(self, command: list[str] | None = None, *, env: dict[str, str] | None = None,
                 workdir: str | None = None, quiet: bool = False) -> "SPMDResult":
        """Run the program (or ``command``) on every reserved host and wait for it.

        Output streams to this process's stdout/stderr, each line prefixed by its host (``quiet``
        keeps it in the logs only: ``monarch logs --run RUN_ID``).  Raises :class:`RunError`
        naming the first rank that failed; Ctrl-C stops every rank and re-raises.
        """
        from monarch._workbench.reserve import load_live
        from monarch._workbench.run import run_command, run_failure

        program = self.program
        if command is not None:
            argv = [str(a) for a in command]
        elif program is not None:
            argv = program.argv
        else:
            raise UsageError(f"job {self.record.name!r} was reserved by `monarch serve` and has no SPMD program",
                             "pass one: job.run_spmd(['torchrun', '--nproc-per-node=2', 'train.py'])")
        self.record, self.path = load_live(path=self.path)
        run_env = {**(program.env if program else {}), **(env or {})}
        macros = {"app_id": self.record.job_id, "img_root": "", "base_img_root": "", "rank0_env": "MASTER_ADDR"}
        outcome = run_command(self.record, argv, env=run_env, cwd=workdir or os.getcwd(), show_output=not quiet,
                              expand=macros)
        if outcome.interrupted:
            raise KeyboardInterrupt
        failure = run_failure(self.record, outcome)  # the engine's words, as `monarch run` prints them
        if failure is not None:
            raise RunFailed(failure.message, failure.hint or f"`monarch logs --run {outcome.run_id}` has every rank's output",
                            exit_code=failure.exit_code, run_id=outcome.run_id)
        return SPMDResult(outcome.run_id, {r.rank: r.exit_code for r in outcome.results})


@dataclass
class SPMDResult:
    """A finished ``run_spmd``: its run id (for ``monarch logs --run``) and each host rank's exit code."""

    run_id: str
    exit_codes: dict[int, int | None]


def serve(appdef: Any, scheduler: str = "local_cwd", scheduler_cfg: dict | None = None, *,
          name: str = DEFAULT_CONTEXT, replace: bool = False, wait: bool = True,
          timeout: float | None = None) -> SPMDJob:
    """Reserve hosts for an SPMD program and start a monarch agent on each; returns the job.

    ``appdef`` is a torchrun command (``["torchrun", "--nproc-per-node=4", "train.py"]``) or a
    TorchX ``AppDef`` with one role.  ``scheduler`` is ``"local_cwd"`` (hosts on this machine,
    the default) or ``"slurm"`` with ``scheduler_cfg`` such as ``{"partition": "debug",
    "time": "2:00:00"}``.  A live reservation called ``name`` of the same shape is reused; one
    of another shape raises ``monarch.errors.StateError`` unless ``replace=True``.
    """
    from monarch._workbench.reserve import reserve
    from monarch._workbench.state import save_state

    program = program_of(appdef)
    spec = _spec_for(program, scheduler, scheduler_cfg)
    paths = StatePaths()
    r = reserve(spec, name=name, paths=paths, wait=wait, replace=replace, timeout=timeout)
    r.record.program = asdict(program)
    save_state(r.path, r.record)
    paths.set_current(name)
    return SPMDJob(r.record, r.path)


def job_load(filename: str | None = None) -> SPMDJob:
    """The SPMD job in ``filename`` (default: MONARCH_JOB, else ``.monarch/job_state.pkl``)."""
    from monarch._workbench.state import load_state

    path = os.path.abspath(filename) if filename else StatePaths().resolve(None)
    return SPMDJob(load_state(path), path)


__all__ = ["SPMDJob", "SPMDProgram", "SPMDResult", "job_load", "program_of", "serve"]
