"""submitit on a monarch reservation: ``AutoExecutor(folder, cluster="monarch")``.

    import submitit
    executor = submitit.AutoExecutor(folder="logs", cluster="monarch")   # the current reservation
    executor.update_parameters(nodes=2, tasks_per_node=2, timeout_min=10)
    job = executor.submit(train, cfg)      # starts on the reserved hosts at once: no queue, no sbatch
    print(job.result())

Registered with submitit through entry points (``pyproject.toml``), so user code imports nothing
from monarch. ``monarch_job=`` picks a reservation by context name or state-file path (default: the
one ``monarch`` commands use here). A job is one SPMD run through the hosts' agents (the warm path
``monarch run`` takes): each host starts ``tasks_per_node`` tasks with submitit's environment
(``submitit.JobEnvironment()`` gives rank, local rank, world size, hostnames, job id), writing
submitit's usual files in ``folder`` (which the hosts must share, as on Slurm).

Jobs run at most as many at once as the reservation has slots (hosts × procs per host); the rest
wait in order (``map_array`` spreads over the hosts). ``cancel()`` stops the tasks on every host;
``timeout_min`` sends SIGUSR2 ``signal_delay_s`` before the end (submitit's checkpoint/requeue
for ``Checkpointable`` callables), then stops the tasks.

Jobs belong to the Python process that submitted them, as procs belong to their client: when it
exits, its unfinished jobs are stopped.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import typing as tp
from pathlib import Path

try:
    from submitit.core import core, job_environment, utils
except ModuleNotFoundError as e:
    from monarch_agents.errors import missing_part

    missing = missing_part(e)
    if missing is None:
        raise
    message, hint = missing
    raise ModuleNotFoundError(f"{message}: {hint}", name=e.name) from None

from monarch._workbench._submitit_task import REQUEUE_EXIT_CODE, TIMEOUT_EXIT_CODE
from monarch._workbench.exit_status import signal_of

_DEFAULT_TIMEOUT_MIN = 5.0
_DEFAULT_SIGNAL_DELAY_S = 30


class MonarchJobEnvironment(job_environment.JobEnvironment):
    """What ``submitit.JobEnvironment()`` reads inside a task started on a monarch reservation."""

    _env = {
        "job_id": "MONARCH_SUBMITIT_JOB_ID",
        "num_tasks": "MONARCH_SUBMITIT_NTASKS",
        "num_nodes": "MONARCH_SUBMITIT_NNODES",
        "node": "NODE_RANK",
        "global_rank": "MONARCH_SUBMITIT_GLOBALID",
        "local_rank": "MONARCH_SUBMITIT_LOCALID",
    }

    @property
    def hostname(self) -> str:
        return os.environ.get("MONARCH_HOSTNAME") or super().hostname

    @property
    def hostnames(self) -> tp.Sequence[str]:
        names = os.environ.get("MONARCH_SUBMITIT_HOSTNAMES", "")
        return names.split(",") if names else [self.hostname]

    def _requeue(self, countdown: int) -> None:
        # The host's task launcher starts the tasks again when one exits with this code.
        sys.exit(REQUEUE_EXIT_CODE)


class _Submission:
    """One submitted job in this process: its place in the queue, then its run."""

    def __init__(self, job_id: str, nodes: int, per_node: int, env: dict[str, str], argv: list[str]):
        self.job_id = job_id
        self.nodes = nodes
        self.per_node = per_node
        self.env = env
        self.argv = argv
        self.state = "PENDING"
        self.reason = ""
        self.hosts: list = []
        self.run: tp.Any = None  # monarch._workbench.run.RemoteRun once started
        self.cancelled = False
        self.dispatcher: _Dispatcher | None = None
        self.done = threading.Event()


class _Dispatcher:
    """Starts submissions on free host slots of one reservation, in order; one per reservation."""

    def __init__(self, record: tp.Any):
        self.record = record
        self.slots = max(1, record.spec.procs_per_host)
        self.free = {h.host_rank: self.slots for h in record.hosts}
        self.queue: collections.deque[_Submission] = collections.deque()
        self.lock = threading.Lock()

    def submit(self, sub: _Submission) -> None:
        sub.dispatcher = self
        with self.lock:
            self.queue.append(sub)
        self._start_what_fits()

    def cancel(self, sub: _Submission) -> None:
        with self.lock:
            queued = sub in self.queue
            if queued:
                self.queue.remove(sub)
        sub.cancelled = True
        if queued:
            self._end(sub, "CANCELLED", "cancelled before it started")
        elif sub.run is not None:
            sub.run.stop()

    def _start_what_fits(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    return
                sub = self.queue[0]
                hosts = sorted((h for h in self.record.hosts if self.free[h.host_rank] >= sub.per_node),
                               key=lambda h: (-self.free[h.host_rank], h.host_rank))[: sub.nodes]
                if len(hosts) < sub.nodes:
                    return  # the first in line waits for room; later ones wait behind it
                self.queue.popleft()
                for h in hosts:
                    self.free[h.host_rank] -= sub.per_node
            self._start(sub, sorted(hosts, key=lambda h: h.host_rank))

    def _start(self, sub: _Submission, hosts: list) -> None:
        from monarch._workbench.run import RemoteRun

        sub.hosts = hosts
        env = {**sub.env, "MONARCH_SUBMITIT_HOSTNAMES": ",".join(h.host for h in hosts)}
        run = RemoteRun(self.record, hosts, sub.argv, env=env, cwd=os.getcwd(), on_output=lambda *_: None)
        run.run_id = run.outcome.run_id = sub.job_id  # the hosts' logs and submitit's files share one id
        sub.run = run
        sub.state = "RUNNING"
        run.start()
        threading.Thread(target=self._wait, args=(sub, hosts), name=f"submitit-{sub.job_id}", daemon=True).start()

    def _wait(self, sub: _Submission, hosts: list) -> None:
        sub.run.wait()
        with self.lock:
            for h in hosts:
                self.free[h.host_rank] += sub.per_node
        outcome = sub.run.outcome
        failure = outcome.first_failure
        if sub.cancelled:
            self._end(sub, "CANCELLED", "cancelled")
        elif failure is None:
            self._end(sub, "COMPLETED", "")
        else:
            code = failure.exit_code
            if code == TIMEOUT_EXIT_CODE:
                self._end(sub, "TIMEOUT", f"node {failure.rank} on {failure.host}: ran out of its "
                                          f"{float(sub.env['MONARCH_SUBMITIT_TIMEOUT_S']) / 60:g} min")
            else:
                # 128+N: the launcher passed on a task's signal; a raw -N is the launcher itself
                # killed, and the host agent's reason says why (the reservation released, say).
                sig = signal_of(code) if code is not None and code > 0 else None
                if sig is not None:
                    reason = f"a task was killed by {sig.name}"
                else:
                    reason = failure.reason or f"exit code {code}"
                self._end(sub, "FAILED", f"node {failure.rank} on {failure.host}: {reason}")
        self._start_what_fits()

    def _end(self, sub: _Submission, state: str, reason: str) -> None:
        sub.state, sub.reason = state, reason
        sub.done.set()


_DISPATCHERS: dict[tuple[str, str], _Dispatcher] = {}
_SUBMISSIONS: dict[str, _Submission] = {}
_REGISTRY_LOCK = threading.Lock()


def _dispatcher(record: tp.Any) -> _Dispatcher:
    key = (record.job_dir, record.job_id)
    with _REGISTRY_LOCK:
        d = _DISPATCHERS.get(key)
        if d is None:
            d = _DISPATCHERS[key] = _Dispatcher(record)
        return d


class MonarchJob(core.Job[core.R]):
    """submitit's Job for a job on a monarch reservation (states: PENDING, RUNNING, COMPLETED,
    FAILED, CANCELLED, TIMEOUT; UNKNOWN in another process once its submitter is gone)."""

    def _submission(self) -> _Submission | None:
        return _SUBMISSIONS.get(self.job_id)

    @property
    def state(self) -> str:
        sub = self._submission()
        if sub is not None:
            return sub.state
        return "COMPLETED" if self.paths.result_pickle.exists() else "UNKNOWN"

    def get_info(self, mode: str = "force") -> dict[str, str]:
        sub = self._submission()
        info = {"jobState": self.state}
        if sub is not None:
            info.update(reason=sub.reason, nodes=",".join(h.host for h in sub.hosts))
        return info

    def done(self, force_check: bool = False) -> bool:
        return self.state not in ("PENDING", "RUNNING")

    def wait(self) -> None:
        sub = self._submission()
        if sub is not None:
            sub.done.wait()
        else:
            super().wait()

    def cancel(self, check: bool = True) -> None:
        sub = self._submission()
        if sub is not None and not sub.done.is_set() and sub.dispatcher is not None:
            sub.dispatcher.cancel(sub)

    def _get_outcome_and_result(self) -> tuple[str, tp.Any]:
        sub = self._submission()
        if sub is not None and sub.done.is_set() and not self.paths.result_pickle.exists():
            message = [f"Job {self.job_id} (task: {self.task_id}) has not produced any output "
                       f"(state: {sub.state}: {sub.reason})"]
            log = self.stderr()
            if log:
                message += ["Error stream produced:", "-" * 40, log]
            raise utils.UncompletedJobError("\n".join(message))
        return super()._get_outcome_and_result()


class MonarchExecutor(core.PicklingExecutor):
    """Runs submitit jobs on the hosts of a monarch reservation (``cluster="monarch"``).

    Parameters
    ----------
    folder: submitit's folder for pickles and logs (shared with the hosts).
    job: the reservation, as a context name or a state-file path (default: the current one).
    python: the interpreter the hosts run tasks with (default: this one).
    """

    job_class = MonarchJob

    def __init__(self, folder: tp.Union[str, Path], job: str | None = None, max_num_timeout: int = 3,
                 max_pickle_size_gb: float = 1.0, python: str | None = None) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout, max_pickle_size_gb=max_pickle_size_gb)
        self._throttling = 0.0  # no scheduler to spare: submit as fast as asked
        self.record = _load_reservation(job)
        self.python = python or sys.executable
        self.update_parameters(timeout_min=_DEFAULT_TIMEOUT_MIN)

    @classmethod
    def affinity(cls) -> int:
        return -1  # only when asked for by name: a reservation is a choice, not an environment

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return {"timeout_min", "nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem_gb", "name",
                "stderr_to_stdout", "signal_delay_s"}

    def _num_tasks(self) -> int:
        return int(self.parameters.get("nodes", 1)) * int(self.parameters.get("tasks_per_node", 1))

    def _check_fits(self) -> tuple[int, int]:
        nodes = int(self.parameters.get("nodes", 1))
        per_node = int(self.parameters.get("tasks_per_node", 1))
        hosts = len(self.record.hosts)
        slots = max(1, self.record.spec.procs_per_host)
        if nodes < 1 or per_node < 1:
            raise ValueError(f"nodes and tasks_per_node must be at least 1 (got {nodes} and {per_node})")
        if nodes > hosts or per_node > slots:
            raise ValueError(
                f"the monarch reservation {self.record.name!r} has {hosts} host(s) x {slots} proc(s), too small for "
                f"nodes={nodes} x tasks_per_node={per_node}; reserve more with `monarch serve --hosts {max(nodes, hosts)} "
                f"--procs-per-host {max(per_node, slots)} --replace`")
        return nodes, per_node

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[core.Job]:
        from monarch._workbench.run import new_run_id

        nodes, per_node = self._check_fits()
        timeout_min = float(self.parameters.get("timeout_min", _DEFAULT_TIMEOUT_MIN))
        jobs: list[core.Job] = []
        for delayed in delayed_submissions:
            job_id = new_run_id()
            job: MonarchJob = MonarchJob(folder=self.folder, job_id=job_id, tasks=list(range(nodes * per_node)))
            # The pickle is in place before the tasks start: they never wait for it.  Its folder is
            # the user's alone (made 0700, or refused in one line): what is unpickled from it, here
            # (results) and on the hosts (the function), must be what this user wrote there.
            from monarch_agents.files import private_dir

            private_dir(str(job.paths.folder))
            delayed.set_timeout(timeout_min, self.max_num_timeout)  # type: ignore[arg-type]  # submitit types minutes as int; it takes a float
            delayed.dump(job.paths.submitted_pickle)
            size = job.paths.submitted_pickle.stat().st_size / 1024**3
            if size * len(delayed_submissions) > self.max_pickle_size_gb:
                job.paths.submitted_pickle.unlink()
                raise RuntimeError(f"submitting about {len(delayed_submissions)} x {size:.2f} GB of pickled functions "
                                   f"and arguments (more than max_pickle_size_gb={self.max_pickle_size_gb})")
            env = {"MONARCH_SUBMITIT_JOB_ID": job_id, "MONARCH_SUBMITIT_NTASKS": str(nodes * per_node),
                   "MONARCH_SUBMITIT_NNODES": str(nodes), "MONARCH_SUBMITIT_TASKS_PER_NODE": str(per_node),
                   "MONARCH_SUBMITIT_TIMEOUT_S": str(timeout_min * 60),
                   "MONARCH_SUBMITIT_SIGNAL_DELAY_S": str(self.parameters.get("signal_delay_s", _DEFAULT_SIGNAL_DELAY_S)),
                   "MONARCH_SUBMITIT_STDERR_TO_STDOUT": "1" if self.parameters.get("stderr_to_stdout") else "",
                   "SUBMITIT_EXECUTOR": "monarch"}
            argv = [self.python, "-m", "monarch._workbench._submitit_task", str(self.folder)]
            sub = _Submission(job_id, nodes, per_node, env, argv)
            _SUBMISSIONS[job_id] = sub
            _dispatcher(self.record).submit(sub)
            jobs.append(job)
        return jobs

    # The abstract hooks of a submission-file executor: a monarch job has no submission file.
    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return ""

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return []

    @staticmethod
    def _get_job_id_from_submission_command(string: tp.Union[bytes, str]) -> str:
        return ""

    @property
    def _submitit_command_str(self) -> str:
        return ""


def _load_reservation(job: str | None) -> tp.Any:
    """The live reservation (record) named by ``job``: a context name, a state-file path, or None."""
    from monarch._workbench.reserve import load_live

    if job is not None and (os.sep in job or job.endswith(".pkl")):
        record, _ = load_live(path=os.path.abspath(job))
    else:
        record, _ = load_live(job)
    return record


__all__ = ["MonarchExecutor", "MonarchJob", "MonarchJobEnvironment"]
