"""Run a command on reserved hosts: the engine behind ``monarch run -- CMD``.

Each selected host agent runs the command with the environment multi-node
torchrun and ``torch.distributed`` expect (``MASTER_ADDR``/``MASTER_PORT``,
``NODE_RANK``, ``NNODES`` and torchrun's ``PET_*`` twins) plus ``MONARCH_*``.
Output comes back live.  A :class:`FailurePolicy` says whether the first rank that fails stops
the others (``monarch run``: torchrun's ranks would wait forever for it) or not (``monarch exec``:
each rank's command stands alone); :attr:`RunOutcome.exit_code` is the one rule for the status a
run ends with, and :func:`run_failure` the one place its failure is worded (a :class:`RunFailed`).
Interrupting stops every rank within 2 s.
"""

from __future__ import annotations

import enum
import fcntl
import json
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Iterator

from monarch_agents import messages as m
from monarch_agents.files import private_dir
from monarch_agents.errors import SupervisionError
from monarch_agents.runtime import Runtime, StreamPort
from monarch.errors import ExitCode, MonarchError, RunError, RunFailed, UsageError
from monarch._workbench.exit_status import exit_status
from monarch._workbench.state import HostRecord, JobRecord

log = logging.getLogger("monarch.run")
_STOP_GRACE_S = 1.5
#: How long a stopped run waits, after SIGKILL, for its ranks' ends before it ends without them.
_STOP_REPORT_S = 5.0
#: How often a run re-reads its reservation's time left (an admin may change the limit).
_TIME_RECHECK_S = 60.0
#: How long a failed run waits for a job that is COMPLETING to show why it ended.
_ENDING_WAIT_S = 3.0
#: How long a rank's end, come through the tree, waits for the rest of its output (which comes straight).
_OUTPUT_WAIT_S = 2.0
#: How long a signal to every rank waits to hear which host agents were told.
_SIGNAL_WAIT_S = 5.0
#: How long a run that lost a host agent watches it before calling it frozen rather than dead.
_DYING_WAIT_S = 1.0
#: The client acknowledges a rank's output (RunAck) each time it consumed this much more: its host
#: agent sends at most monarch_agents.services.runs.WINDOW bytes ahead, so a slow client slows the rank.
_ACK_EVERY = 1 << 20


#: How a host agent's reason begins when a rank never started (no fork, a missing working directory).
NOT_STARTED = "could not start"


@dataclass
class RankResult:
    rank: int
    host: str
    exit_code: int | None = None
    reason: str = ""
    #: The rank's host agent stopped answering (died, froze, or its host is unreachable).
    agent_lost: bool = False
    #: Why the rank's log on its host is incomplete (a full disk, say); '' when it is whole.
    log_error: str = ""

    @property
    def started(self) -> bool:
        return not self.reason.startswith(NOT_STARTED)


class FailurePolicy(enum.Enum):
    """What a rank's failure does to the others of its run."""

    #: The others get SIGTERM (``monarch run``, ``run_spmd``, submitit): torchrun's ranks would wait
    #: forever for the failed one.  The run's status is the first failed rank's.
    STOP_OTHERS = "stop-others"
    #: The others go on (``monarch exec``): each rank's command stands alone.  The run's status is
    #: the highest of its ranks' statuses.
    INDEPENDENT = "independent"


@dataclass
class RunOutcome:
    run_id: str
    results: list[RankResult] = field(default_factory=list)
    interrupted: bool = False
    first_failed: int | None = None  # the rank that failed first, in time
    policy: FailurePolicy = FailurePolicy.STOP_OTHERS

    @property
    def first_failure(self) -> RankResult | None:
        return None if self.first_failed is None else self.results[self.first_failed]

    @property
    def exit_code(self) -> int:
        """The run's status, the one rule: 130 interrupted; else the first failed rank's status
        (:attr:`FailurePolicy.STOP_OTHERS`: the others' ends are our SIGTERM's doing) or the highest
        of every rank's (:attr:`FailurePolicy.INDEPENDENT`), where a rank's status is 5 for a host
        agent lost, 6 for a rank that could not start, else :func:`exit_status` of its own code
        (a signal N is 128+N, as a shell gives it)."""
        if self.interrupted:
            return ExitCode.INTERRUPTED
        f = self.first_failure
        if f is None:
            return ExitCode.OK
        if self.policy is FailurePolicy.INDEPENDENT:
            return max(rank_status(r) for r in self.results)
        return rank_status(f)


def rank_status(r: RankResult) -> int:
    """One rank's status in a run's: see :attr:`RunOutcome.exit_code`."""
    if r.exit_code == 0:
        return ExitCode.OK
    if r.agent_lost:
        return ExitCode.AGENT
    if not r.started:
        return ExitCode.RUN
    return exit_status(r.exit_code)


def select_hosts(record: JobRecord, ranks: list[int] | None) -> list[HostRecord]:
    """The hosts of ``ranks`` (in that order), or every host by rank; a rank named twice or not in
    the reservation is a :class:`UsageError` (a run runs once per host: its ranks are its hosts)."""
    by_rank = {h.host_rank: h for h in record.hosts}
    if not ranks:
        return [by_rank[r] for r in sorted(by_rank)]
    missing = [r for r in ranks if r not in by_rank]
    if missing:
        raise UsageError(f"no host rank {missing[0]} in this reservation (it has 0..{len(record.hosts) - 1})")
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise UsageError(f"host rank {twice[0]} is named twice", "name each host once, e.g. --hosts 0,1")
    return [by_rank[r] for r in ranks]


def new_run_id() -> str:
    # os.urandom, not uuid: uuid imports platform, ~2 ms of every `monarch run`'s start.
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def run_env(record: JobRecord, hosts: list[HostRecord], index: int, run_id: str, master_port: int,
            extra: dict[str, str]) -> dict[str, str]:
    """The environment of one rank (host) of a run."""
    n = len(hosts)
    master = hosts[0].ip or "127.0.0.1"
    env = {
        "MASTER_ADDR": master, "MASTER_PORT": str(master_port),
        "NODE_RANK": str(index), "GROUP_RANK": str(index), "NNODES": str(n),
        "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(master_port),
        "PET_NODE_RANK": str(index), "PET_NNODES": str(n),
        "MONARCH_JOB_NAME": record.name, "MONARCH_RUN_ID": run_id,
        "MONARCH_HOST_RANK": str(hosts[index].host_rank), "MONARCH_NUM_HOSTS": str(n),
        "MONARCH_PROCS_PER_HOST": str(record.spec.procs_per_host),
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env


def pick_port(host: HostRecord) -> int:
    """A free port for the rendezvous on the first host (checked when it is this machine)."""
    for _ in range(20):
        port = random.randint(20000, 45000)
        if host.ip not in ("127.0.0.1", "localhost", ""):
            return port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    return random.randint(20000, 45000)


class RunLock:
    """One ``monarch run`` at a time per reservation (a second one gets a clear error)."""

    def __init__(self, record: JobRecord):
        self.path = os.path.join(record.job_dir, "run.lock")
        self.fd = -1
        self.record = record

    def __enter__(self) -> "RunLock":
        private_dir(os.path.dirname(self.path))
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise RunError(f"another `monarch run` (pid {holder or '?'}) is using job {self.record.name!r}",
                           "wait for it, stop it with Ctrl-C, or reserve another job with `monarch serve --name NAME`")
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def record_run(record: JobRecord, run_id: str, argv: list[str], hosts: list[HostRecord], detached: bool,
               kind: str = "command") -> None:
    """Append the run to the job's history, for ``monarch logs``.

    ``kind``: "command" (ranks on the host agents, logs there) or "program" (an actor program
    run here by ``monarch run prog.py``, its output kept in the job folder).
    """
    _append_history(record, {"run_id": run_id, "argv": argv, "hosts": [h.host_rank for h in hosts],
                             "started": time.time(), "detached": detached, "kind": kind})


def record_run_end(record: JobRecord, run_id: str, exit_code: int, ended: float | None = None) -> None:
    """Note how a run ended (``monarch logs --list`` shows it without asking the agents)."""
    _append_history(record, {"run_id": run_id, "ended": ended or time.time(), "exit_code": exit_code})


def _append_history(record: JobRecord, entry: dict) -> None:
    # One short line per write, opened O_APPEND: lines of runs ending together do not mix.
    path = os.path.join(record.job_dir, "runs.jsonl")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as e:
        # A full disk must not fail (or hang) the run itself: `monarch logs --list` then asks the agents.
        sys.stderr.write(f"warning: could not note the run in {path}: {e.strerror or e}\n")


def run_history(record: JobRecord) -> list[dict]:
    """The reservation's runs, oldest first; an ended run has ``ended`` and ``exit_code``."""
    runs: dict[str, dict] = {}
    try:
        with open(os.path.join(record.job_dir, "runs.jsonl")) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []
    for entry in lines:
        if "argv" in entry:
            runs[entry["run_id"]] = {"kind": "command", **entry}
        elif entry.get("run_id") in runs:
            runs[entry["run_id"]].update(ended=entry["ended"], exit_code=entry["exit_code"])
    return list(runs.values())


def signal_run(record: JobRecord, run_id: str, signum: int = signal.SIGTERM) -> list[str]:
    """Send ``signum`` to every rank of run ``run_id`` (one started by any client); the hosts that could not be told."""
    from monarch._workbench.hosts import fan_out_hosts

    hosts = list(record.hosts)
    call = fan_out_hosts(record, hosts, lambda i, h: m.SignalRun(run_id, signum), timeout_s=_SIGNAL_WAIT_S)
    call.wait(_SIGNAL_WAIT_S + 1.0)
    return [h.host for i, h in enumerate(hosts) if not call.results.get(i, (False,))[0]]


class RemoteRun:
    """A command running on several host agents; output arrives via ``on_output``."""

    def __init__(self, record: JobRecord, hosts: list[HostRecord], argv: list[str], *, env: dict[str, str],
                 cwd: str | None, on_output: Callable[[int, str, bytes], None], detach: bool = False,
                 expand: dict[str, str] | None = None, on_debug: Callable[[dict], None] | None = None,
                 policy: FailurePolicy = FailurePolicy.STOP_OTHERS):
        """``policy``: whether the first failure stops the other ranks (:class:`FailurePolicy`).
        ``expand``: when given, ``$NAME``/``${NAME}`` in ``argv`` is replaced per rank from the rank's
        environment and then from ``expand`` (TorchX macros such as ``${replica_id}``), as TorchX and a
        shell would; ``$$`` is a literal ``$``.  Without it, ``argv`` goes out untouched."""
        self.expand = expand
        self.record = record
        self.hosts = hosts
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.on_output = on_output
        #: Called once per debug session a rank opens (breakpoint(), --pdb), with the session's description
        #: (default: one line on stderr, as `monarch run` says it).
        self.on_debug = on_debug or _say_debug_waiting
        self.detach = detach
        self.run_id = new_run_id()
        self.rt: Runtime = record.runtime()
        self.policy = policy
        self.outcome = RunOutcome(self.run_id, [RankResult(i, h.host) for i, h in enumerate(hosts)], policy=policy)
        self.left = len(hosts)
        self.done = threading.Event()
        self.lock = threading.Lock()
        self._stream: StreamPort | None = None
        self._consumed = [0] * len(hosts)  # bytes of output printed, per rank
        self._acked = [0] * len(hosts)
        self._output_lost = False
        #: Ranks whose end came (through the tree) before all their output (straight from the host):
        #: rank -> (bytes it sent, code, reason).
        self._ends: dict[int, tuple[int, int, str]] = {}
        self._fanout = None

    def start(self) -> None:
        """Start every rank, through the reservation's tree of host agents (``monarch_agents.fanout``):
        each rank's end comes back up the tree; its output comes straight here, on our stream port."""
        from monarch._workbench.hosts import NO_PORT, fan_out_hosts

        rt = self.rt
        port = self.pick_master_port()
        if self.detach:
            reply, owner = m.PortRef("", 0), ""  # output only in the hosts' logs; it outlives us
        else:
            # Our own port: other runs and shells of this process have theirs.  A host agent lost is
            # told by the tree, which is where the rank's end comes from.
            self._stream = rt.open_stream(self._on_stream)
            reply, owner = self._stream.ref, rt.addr

        def command(i: int, h: HostRecord) -> m.RunCommand:
            env = run_env(self.record, self.hosts, i, self.run_id, port, self.env)
            return m.RunCommand(self.run_id, self.argv_for(i, env), env, self.cwd, reply, i, owner, NO_PORT)

        self._fanout = fan_out_hosts(self.record, self.hosts, command, timeout_s=None,
                                     on_result=None if self.detach else self._on_end)
        if self.detach:
            # Nothing more comes back to us: only see that the commands have left before we do.
            self._fanout.sent.wait(_SIGNAL_WAIT_S)

    def argv_for(self, index: int, env: dict[str, str]) -> list[str]:
        if self.expand is None:
            return list(self.argv)
        import string

        values = {**self.expand, "replica_id": str(index), **env}
        return [string.Template(a).safe_substitute(values) for a in self.argv]

    def pick_master_port(self) -> int:
        return pick_port(self.hosts[0])

    def _on_end(self, rank: int, result: tuple) -> None:
        """A rank's end, from the tree (IO thread): ``(True, (code, reason, log_error, bytes sent))``, or
        ``(False, why)`` when its host agent was lost.  Its output comes on another path (straight
        from its host): the rank is finished once that many bytes were printed here too."""
        ok, value = result
        if not 0 <= rank < len(self.hosts):
            return
        if not ok:
            self._finish(rank, ExitCode.AGENT, f"{value} during the run", agent_lost=True)
            return
        try:
            code, reason, log_error, sent = value
        except (TypeError, ValueError):
            self._finish(rank, ExitCode.AGENT, f"host agent on {self.hosts[rank].host} sent a malformed end",
                         agent_lost=True)
            return
        self.outcome.results[rank].log_error = str(log_error)
        with self.lock:
            if self._consumed[rank] < sent and rank not in self._ends:
                self._ends[rank] = (sent, int(code), str(reason))
                self.rt.mailbox.call_later(_OUTPUT_WAIT_S, lambda: self._end_waited(rank))
                return
        self._finish(rank, int(code), str(reason))

    def _end_waited(self, rank: int) -> None:
        """A rank's end waited for its output; past :data:`_OUTPUT_WAIT_S` it ends without the rest."""
        with self.lock:
            end = self._ends.pop(rank, None)
        if end is not None:
            self._finish(rank, end[1], end[2])

    def _on_stream(self, msg: m.RunOutput | m.RunExited) -> None:
        if type(msg) is m.RunOutput:
            try:
                self.on_output(msg.rank, msg.stream, msg.data)
            except OSError:
                # Our stdout is closed (`monarch run ... | head`): stop the ranks, as a pipe stops its writer.
                if not self._output_lost:
                    self._output_lost = True
                    threading.Thread(target=self.stop, name="output-lost", daemon=True).start()
            self._ack(msg.rank, len(msg.data))
            with self.lock:
                end = self._ends.get(msg.rank)
                if end is not None and self._consumed[msg.rank] >= end[0]:
                    del self._ends[msg.rank]
                else:
                    end = None
            if end is not None:
                self._finish(msg.rank, end[1], end[2])
        elif type(msg) is m.RunExited:
            if 0 <= msg.rank < len(self.outcome.results):
                self.outcome.results[msg.rank].log_error = msg.log_error
            self._finish(msg.rank, msg.exit_code, msg.reason)
        elif type(msg) is m.DebugWaiting:
            self.on_debug(msg.session)

    def _ack(self, rank: int, n: int) -> None:
        if not 0 <= rank < len(self._consumed):
            return
        self._consumed[rank] += n
        if self._consumed[rank] - self._acked[rank] >= _ACK_EVERY:
            self._acked[rank] = self._consumed[rank]
            try:
                self.rt.send(self.hosts[rank].addr, m.RunAck(self.run_id, rank, self._consumed[rank]))
            except SupervisionError:
                pass  # its loss is reported by _agent_lost

    def _finish(self, rank: int, code: int, reason: str, agent_lost: bool = False) -> None:
        with self.lock:
            r = self.outcome.results[rank]
            if r.exit_code is not None:
                return
            r.exit_code, r.reason, r.agent_lost = code, reason, agent_lost
            self.left -= 1
            first_failure = code != 0 and self.outcome.first_failed is None
            if first_failure:
                self.outcome.first_failed = rank
            finished = self.left == 0
        if first_failure and self.policy is FailurePolicy.STOP_OTHERS:
            # The other ranks would wait forever for the failed one (torchrun does): stop them.
            self.signal(signal.SIGTERM)
        if finished:
            if self._stream is not None:
                self._stream.close()
            self.done.set()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every rank (through the tree; returns at once)."""
        from monarch._workbench.hosts import fan_out_hosts

        fan_out_hosts(self.record, self.hosts, lambda i, h: m.SignalRun(self.run_id, signum), timeout_s=_SIGNAL_WAIT_S)

    def stop(self) -> None:
        """Stop every rank: SIGTERM, then SIGKILL after a short grace."""
        self.outcome.interrupted = True
        self.signal(signal.SIGTERM)
        if not self.done.wait(_STOP_GRACE_S):
            self.signal(signal.SIGKILL)
            if not self.done.wait(_STOP_REPORT_S):
                self.give_up(f"did not report its end within {_STOP_GRACE_S + _STOP_REPORT_S:.0f} s of being stopped")

    def give_up(self, why: str) -> None:
        """End the run now: every rank not heard from ends with ``why`` (its host agent is not answering for it)."""
        for rank, h in enumerate(self.hosts):
            self._finish(rank, ExitCode.AGENT, f"rank {rank} on {h.host} {why}", agent_lost=True)

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def _say_debug_waiting(session: dict) -> None:
    from monarch_agents.services.debug import waiting_line

    sys.stderr.write(waiting_line(session) + "\n")
    sys.stderr.flush()


def run_command(record: JobRecord, argv: list[str], *, hosts: list[HostRecord] | None = None,
                env: dict[str, str] | None = None, cwd: str | None = None, show_output: bool = True,
                color: bool = False, expand: dict[str, str] | None = None, detach: bool = False,
                warn_before_s: float | None = None, on_warning: Callable[[str], None] | None = None,
                on_debug: Callable[[dict], None] | None = None, all_to_stderr: bool = False,
                policy: FailurePolicy = FailurePolicy.STOP_OTHERS) -> RunOutcome:
    """Run ``argv`` on ``hosts`` (default: every host, by rank) of ``record`` and wait for it: the one
    engine behind ``monarch run -- CMD`` and :meth:`monarch.job.spmd.SPMDJob.run_spmd`.

    One run at a time per reservation (:class:`RunLock`); the run is added to the history for
    ``monarch logs``.  Output is printed as it comes, each line prefixed by its host
    (``show_output`` False keeps it in the hosts' logs only).  ``policy``: whether the first rank
    that fails stops the others (the default) or not (``monarch exec``).  In the main thread, a first Ctrl-C or SIGTERM stops every rank (TERM, then
    KILL) and the outcome says ``interrupted``; a second kills them at once.  ``detach``
    starts the ranks and returns at once.  ``on_warning`` gets one line if the reservation
    comes within ``warn_before_s`` of its time limit during the run; ``on_debug`` gets each debug
    session a rank opens (``breakpoint()``, ``--pdb``).  ``all_to_stderr`` prints stdout lines to
    stderr too (``--json`` keeps stdout for its document).  How it failed, in words:
    :func:`run_failure`.
    """
    hosts = hosts or sorted(record.hosts, key=lambda h: h.host_rank)
    printer = LinePrinter(hosts, color, all_to_stderr=all_to_stderr)
    output = printer.write if show_output and not detach else (lambda *a: None)
    watch = None
    with RunLock(record):
        rr = RemoteRun(record, hosts, argv, env=env or {}, cwd=cwd or os.getcwd(), on_output=output, detach=detach,
                       expand=expand, on_debug=on_debug, policy=policy)
        record_run(record, rr.run_id, argv, hosts, detach)
        if detach:
            rr.start()
            return rr.outcome
        try:
            # Handlers first: a Ctrl-C that lands as the ranks start must stop them too.
            with stop_on_signals(rr):
                rr.start()
                if on_warning is not None and warn_before_s is not None:
                    watch = watch_time_limit(record, rr.done, warn_before_s, on_warning)
                while not rr.wait(0.2):
                    pass
        except KeyboardInterrupt:  # not the main thread (no handlers there), or a second Ctrl-C
            rr.stop()
            raise
        finally:
            printer.flush()
        record_run_end(record, rr.run_id, rr.outcome.exit_code)
        for r in rr.outcome.results:
            if r.log_error:
                sys.stderr.write(f"warning: rank {r.rank} on {r.host}: {r.log_error}\n")
    if watch is not None:
        watch.join(_WATCH_JOIN_S)
    return rr.outcome


#: How long a finished run waits for the time-limit check it started (one squeue: milliseconds).
_WATCH_JOIN_S = 1.0


@contextmanager
def stop_on_signals(rr: RemoteRun) -> Iterator[None]:
    """While inside (main thread only), the first Ctrl-C/SIGTERM stops every rank (TERM, then KILL);
    a second one kills them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupts = []

    def on_signal(signum, frame):
        interrupts.append(signum)
        if len(interrupts) == 1:
            threading.Thread(target=rr.stop, daemon=True).start()
        else:
            rr.signal(signal.SIGKILL)
            rr.outcome.interrupted = True
            rr.done.set()

    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def watch_time_limit(record: JobRecord, done: threading.Event, warn_s: float,
                     emit: Callable[[str], None]) -> threading.Thread:
    """Warn once (``emit``) when the reservation has less than ``warn_s`` left before its time limit.

    Runs beside the run, off its output path: it asks the scheduler once at the start (even if
    the run is already over: a short run is warned too; join the thread to be sure of it), then
    only when the warning falls due or once a minute, and stops with ``done``.  Schedulers
    without a time limit (local) answer None and the watch ends at once.
    """
    from monarch._workbench.reserve import describe

    def watch() -> None:
        while True:
            try:
                d = describe(record)
            except MonarchError:
                return  # a controller that does not answer is for `monarch status` to report
            if d is None or not d.state.alive or d.time_left_s is None:
                return
            if d.time_left_s <= warn_s:
                emit(time_limit_warning(record, d.time_left_s))
                return
            if done.wait(min(d.time_left_s - warn_s, _TIME_RECHECK_S)):
                return

    t = threading.Thread(target=watch, name="time-limit-watch", daemon=True)
    t.start()
    return t


def time_limit_warning(record: JobRecord, left_s: float) -> str:
    """One line for a run whose reservation is close to (or past) its time limit."""
    job = f"{record.spec.scheduler} job {record.job_id}"
    if left_s <= 0:
        return f"the reservation ({job}) is past its time limit: the scheduler is about to end it, and this run with it"
    return (f"the reservation ({job}) reaches its time limit in {format_duration(left_s)}: "
            "this run is stopped then; `monarch serve` a longer --time for more")


def run_program(record: JobRecord, state_path: str, argv: list[str], extra: dict[str, str], *,
                stdout: BinaryIO, stderr: BinaryIO) -> tuple[str, int]:
    """Run a single-controller actor program here, recorded for ``monarch logs`` like any run:
    (its run id, its status by :func:`exit_status`, 130 when interrupted).

    Its output goes to ``stdout``/``stderr`` as it comes and into the job folder.  A Ctrl-C
    reaches the program itself (same process group): it ends with 130, no traceback; a SIGTERM
    to us is passed on to it.
    """
    import selectors
    import subprocess

    from monarch._workbench.logs import ProgramLog

    run_id = new_run_id()
    # MONARCH_JOB: `job_load()` in the program loads this reservation; MONARCH_RUN_JOB: the
    # program talks with its keys.
    env = {**os.environ, **extra, "MONARCH_RUN_JOB": state_path, "MONARCH_JOB": state_path,
           "MONARCH_RUN_ID": run_id, "PYTHONUNBUFFERED": "1"}
    record_run(record, run_id, argv, [], False, kind="program")
    log = ProgramLog(record, run_id, extra)
    # Its writable place, as a command's ranks have theirs (`monarch logs --output DIR` fetches it).
    if "MONARCH_OUTPUT_DIR" not in extra:  # -e MONARCH_OUTPUT_DIR=... wins, a stray one in this shell not
        env["MONARCH_OUTPUT_DIR"] = os.path.join(log.dir, "output")
    try:
        os.makedirs(env["MONARCH_OUTPUT_DIR"], mode=0o700, exist_ok=True)
    except OSError as e:  # a full disk: the program runs without one
        log.error = log.error or f"its output folder could not be made: {e.strerror or e}"
        env.pop("MONARCH_OUTPUT_DIR")
    interrupted = []

    def on_signal(signum, frame):
        interrupted.append(signum)
        if len(interrupted) > 1:  # a second one: a program that did not end on the first is killed
            proc.kill()
        elif signum == signal.SIGTERM:  # Ctrl-C reaches the program from the terminal; SIGTERM does not
            proc.send_signal(signal.SIGTERM)

    # The program ends with us however we end (kill -9 too): it watches this pipe (see program.py).
    life_r, life_w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "monarch._workbench.program", *argv],
                                env={**env, "MONARCH_PROGRAM_LIFELINE": str(life_r)}, pass_fds=(life_r,),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException:
        os.close(life_w)
        raise
    finally:
        os.close(life_r)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    sinks = {"stdout": stdout, "stderr": stderr}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    try:
        while sel.get_map():
            for key, _ in sel.select():
                data = os.read(key.fileobj.fileno(), 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                log.write(key.data, data)
                sinks[key.data].write(data)
                sinks[key.data].flush()
        rc = proc.wait()
    finally:
        sel.close()
        os.close(life_w)
        for s, h in old.items():
            signal.signal(s, h)
    code = exit_status(rc)
    if interrupted or code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        code = ExitCode.INTERRUPTED
    log.close(code, "interrupted" if code == ExitCode.INTERRUPTED else f"exited with code {code}")
    record_run_end(record, run_id, int(code))
    if log.error:
        stderr.write(f"warning: the program's {log.error}\n".encode())
        stderr.flush()
    return run_id, int(code)


def program_failure(run_id: str, code: int) -> RunFailed | None:
    """How an actor program's run failed, in words; None when it succeeded."""
    if code == ExitCode.OK:
        return None
    if code == ExitCode.INTERRUPTED:
        return RunFailed("interrupted", f"`monarch logs --run {run_id}` has its output", exit_code=code,
                         run_id=run_id, interrupted=True)
    return RunFailed(f"the program exited with code {code}", f"`monarch logs --run {run_id}` has its output",
                     exit_code=code, run_id=run_id)


def run_failure(record: JobRecord, outcome: RunOutcome) -> RunFailed | None:
    """How ``outcome`` failed, in words (the one place they are chosen); None when it succeeded.

    A run killed with its allocation (a time limit, a scancel, a node failure) says so instead of
    showing only a signal; a lost host agent says whether it died or froze.
    """
    code = outcome.exit_code
    if outcome.interrupted:
        return RunFailed("interrupted: stopped every rank", exit_code=code, run_id=outcome.run_id, interrupted=True)
    f = outcome.first_failure
    if f is None:
        return None
    hint = ""
    ended = reservation_end(record)
    if ended:
        # The ranks died with the allocation: say that, not only the signal they got.
        message = f"the reservation ended during the run ({record.spec.scheduler} job {record.job_id}: {ended})"
        hint = "`monarch serve` reserves again (`monarch status` shows why it ended)"
    elif f.agent_lost:
        message, hint = _agent_lost_words(record, f)
    else:
        message = f"rank {f.rank} on {f.host} {f.reason}"
        if not f.started and "working directory" in f.reason:
            hint = "-w must name a folder that exists on every host (default: this one)"
        elif record.workspace and _wrote_into_read_only(record, outcome.run_id, f):
            hint = read_only_hint(outcome.run_id)
    return RunFailed(message, hint, exit_code=code, run_id=outcome.run_id)


def read_only_hint(run_id: str | None = None) -> str:
    """What a rank that wrote into the (read-only) workspace should do instead."""
    fetch = f"`monarch logs --run {run_id} --output DIR`" if run_id else "`monarch logs --output DIR`"
    return ("the workspace is read-only on the hosts: write checkpoints and results to $MONARCH_OUTPUT_DIR "
            f"(one folder per run and host; {fetch} copies them here)")


def _wrote_into_read_only(record: JobRecord, run_id: str, f: RankResult) -> bool:
    """Whether the failed rank's stderr says it hit the read-only workspace (EROFS)."""
    from monarch._workbench.hosts import read_log

    host = next((h for h in record.hosts if h.host == f.host), None)
    if host is None:
        return False
    try:
        got = read_log(record, host, run_id, "stderr", 0, timeout=2.0)
    except Exception:
        return False  # only a hint: a host that does not answer now goes without it
    return any(b"Read-only file system" in data for data, _ in got.values())


def _agent_lost_words(record: JobRecord, f: RankResult) -> tuple[str, str]:
    """Dead or frozen: the scheduler still counting the agent's process as alive means it froze
    (stopped, or hung), not that it died.

    Asked a few times over ``_DYING_WAIT_S``: a process killed with -9 closes its sockets (which
    is how the run noticed) a moment before the kernel makes it a zombie, and under load that
    moment is long enough for one look to see it "still there"."""
    from monarch._workbench.reserve import describe

    deadline = time.monotonic() + _DYING_WAIT_S
    while True:
        try:
            d = describe(record)
        except Exception as e:
            log.debug("describe after a lost host agent: %s", e)  # then it reads as died: the likelier case
            d = None
        if d is None or not d.state.alive or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if d is not None and d.state.alive:
        return (f"host agent on {f.host} stopped answering during the run (its process is still there: "
                "stopped or hung?)", "`monarch status` shows which agents answer; `monarch serve --replace` starts new ones")
    why = f": {d.reason}" if d is not None and d.reason else ""
    return (f"host agent on {f.host} died during the run{why}",
            "`monarch serve --replace` makes a new reservation (`monarch status` shows what is left)")


def reservation_end(record: JobRecord) -> str | None:
    """Why the reservation has ended or is ending, in words; None while it lives.

    Asked after a run failed, so that a run killed with its allocation (a time limit, a scancel,
    a node failure) says so instead of showing only a signal.
    """
    from monarch._workbench.reserve import describe

    deadline = time.monotonic() + _ENDING_WAIT_S
    while True:
        try:
            d = describe(record)
        except MonarchError:
            return None
        if d is None:
            return "the scheduler no longer knows it"
        # Slurm shows COMPLETING over the final state until the nodes are clean (seconds at most).
        if d.native_state == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        if d.state.alive:
            return None
        return d.reason or d.native_state.lower() or "ended"


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (or ``M:SS`` under an hour), as Slurm shows time left."""
    s = max(0, int(seconds))
    h, rem = divmod(s, 3600)
    mnt, sec = divmod(rem, 60)
    return f"{h}:{mnt:02d}:{sec:02d}" if h else f"{mnt}:{sec:02d}"


#: A line longer than this is printed in pieces of this size, each on a line of its own (a rank printing
#: gigabytes without a newline must not make the client hold them all).
MAX_LINE = 1 << 20
#: How long the last partial lines wait for a printer busy writing (to a stdout nobody reads).
_FLUSH_WAIT_S = 1.0


def write_whole(target, text: str) -> None:
    """Write ``text`` to ``target`` (a text stream) and flush it, all of it.

    Straight to its file descriptor when it has one: Python's buffered writer drops the rest of a
    large write that a stop and continue cut short (``kill -STOP``/``-CONT`` of a client writing 1 MiB
    to a pipe: the pipe got 64 KiB, the rest was gone, and no error said so); a loop over
    ``os.write`` takes the short count and writes on."""
    try:
        fd = target.fileno()
    except (AttributeError, OSError, ValueError):  # a StringIO, pytest's capture: no descriptor
        target.write(text)
        target.flush()
        return
    target.flush()  # what it buffered goes first
    view = memoryview(text.encode(getattr(target, "encoding", None) or "utf-8", "replace"))
    while view:
        view = view[os.write(fd, view):]


class LinePrinter:
    """Writes a run's output to this process's stdout/stderr, each line prefixed by its host.

    Partial lines are kept until they end (up to :data:`MAX_LINE`), so ranks never interleave inside a
    line.  Linear in its input: a partial line is a list of pieces, joined once when it ends.
    """

    def __init__(self, hosts, color: bool, all_to_stderr: bool = False):
        """``all_to_stderr``: stdout lines too go to stderr (``--json`` keeps stdout for its document)."""
        self.names = {i: h.host for i, h in enumerate(hosts)}
        self.partial: dict[tuple[int, str], tuple[list[bytes], int]] = {}
        self.lock = threading.Lock()
        self.color = color
        self.all_to_stderr = all_to_stderr

    def write(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        out: list[str] = []
        with self.lock:
            start = 0
            while True:
                nl = data.find(b"\n", start)
                if nl < 0:
                    break
                line = data[start:nl]
                if key in self.partial:
                    pieces, _ = self.partial.pop(key)
                    pieces.append(line)
                    line = b"".join(pieces)
                self._format(out, rank, line)
                start = nl + 1
            if start < len(data):
                pieces, size = self.partial.get(key, ([], 0))
                rest = data[start:]
                pieces.append(rest)
                size += len(rest)
                if size >= MAX_LINE:
                    joined = b"".join(pieces)
                    cut = len(joined) - len(joined) % MAX_LINE
                    for i in range(0, cut, MAX_LINE):
                        self._format(out, rank, joined[i:i + MAX_LINE])
                    pieces, size = ([joined[cut:]], len(joined) - cut) if cut < len(joined) else ([], 0)
                if size:
                    self.partial[key] = (pieces, size)
                else:
                    self.partial.pop(key, None)
            if out:
                self._write(stream, "".join(out))

    def _format(self, out: list[str], rank: int, line: bytes) -> None:
        prefix = f"[{self.names.get(rank, rank)}] "
        if self.color:
            prefix = f"\x1b[{36 + rank % 2}m{prefix}\x1b[0m"
        out.append(prefix + line.decode(errors="replace") + "\n")

    def _write(self, stream: str, text: str) -> None:
        write_whole(sys.stderr if stream == "stderr" or self.all_to_stderr else sys.stdout, text)

    def flush(self) -> None:
        # Bounded: a writer blocked on a stdout nobody reads (a paused terminal, a stopped pager)
        # holds the lock, and an interrupted run must still end.
        if not self.lock.acquire(timeout=_FLUSH_WAIT_S):
            return
        try:
            for (rank, stream), (pieces, _) in list(self.partial.items()):
                out: list[str] = []
                self._format(out, rank, b"".join(pieces))
                self._write(stream, "".join(out))
            self.partial.clear()
        finally:
            self.lock.release()
