"""Reserve once, run many: make, reuse, check and release a reservation.

``reserve()`` reuses a live compatible reservation or asks the scheduler for a
new one, then waits until every host agent has written its address;
``load_live()`` is what every later command calls; ``release()`` ends it.
The CLI and ``monarch.job`` both go through here.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from monarch_agents.files import write_atomic
from monarch_agents.keys import JobKeys
from monarch.errors import AgentError, SchedulerError, StateError, UsageError
from monarch._workbench.state import (
    HostRecord,
    JobRecord,
    JobSpec,
    StatePaths,
    load_state,
    make_job_dir,
    remove_state,
    save_state,
)
from monarch_schedulers import Description, HostState, create_scheduler
from monarch_schedulers import names as scheduler_names  # noqa: F401  (for the CLI: the schedulers there are)
from monarch_schedulers.agent_launch import agent_file, write_keys

#: Called while waiting: (phase, hosts ready, hosts wanted, scheduler description or None).
Progress = Callable[[str, int, int, "Description | None"], None]


#: How often ``wait_ready`` asks the scheduler about a starting job, and the most it backs off to while queued.
_DESCRIBE_EVERY_S = 0.5
_DESCRIBE_PENDING_MAX_S = 3.0


#: How long before its time limit a reservation is flagged by ``status`` and ``run`` warns.
TIME_WARNING_MIN = 5.0
TIME_WARNING_ENV = "MONARCH_WARN_BEFORE"


def time_warning_s(minutes: float | None = None) -> float:
    """The warning lead in seconds: ``minutes``, else $MONARCH_WARN_BEFORE (minutes), else 5 minutes."""
    if minutes is None:
        text = os.environ.get(TIME_WARNING_ENV, "").strip()
        try:
            minutes = float(text) if text else TIME_WARNING_MIN
        except ValueError:
            raise UsageError(f"{TIME_WARNING_ENV}={text!r} is not a number of minutes",
                             f"e.g. {TIME_WARNING_ENV}=10, or unset it") from None
    if not minutes >= 0:
        raise UsageError(f"the time-limit warning must be 0 or more minutes, got {minutes!r}")
    return minutes * 60.0


def _quiet(*_: object) -> None:
    pass


@dataclass
class Reservation:
    record: JobRecord
    path: str
    reused: bool


#: What every host agent's zygote imports once, so each proc starts with Monarch's API loaded
#: (user actors import it); named here because monarch_agents/ and monarch_schedulers/ may not name this layer.
AGENT_PRELOAD = ("monarch.actor",)


def scheduler_for(record_or_spec: JobRecord | JobSpec):
    spec = record_or_spec.spec if isinstance(record_or_spec, JobRecord) else record_or_spec
    opts = {}
    if spec.scheduler == "local" and spec.options.get("bind"):
        opts["bind"] = spec.options["bind"]
    if spec.scheduler == "local" and spec.options.get("netns"):
        opts["netns"] = True
    if spec.scheduler == "kubernetes":
        opts = {k: spec.options[k] for k in ("namespace", "kubeconfig", "context") if spec.options.get(k)}
    sched = create_scheduler(spec.scheduler, **opts)
    sched.agent_preload = AGENT_PRELOAD
    return sched


def describe(record: JobRecord) -> Description | None:
    try:
        return scheduler_for(record).describe(record.job_id, job_dir=record.job_dir)
    except SchedulerError:
        raise
    except Exception as e:  # a scheduler that cannot answer is not proof the job is dead
        return Description(record.job_id, HostState.UNKNOWN, reason=str(e))


def reserve(spec: JobSpec, *, name: str, paths: StatePaths | None = None, wait: bool = True,
            replace: bool = False, progress: Progress = _quiet, timeout: float | None = None) -> Reservation:
    """Reuse a live compatible reservation called ``name`` or make a new one."""
    paths = paths or StatePaths()
    path = paths.state_file(name)
    if os.path.exists(path):
        try:
            old = load_state(path)
        except StateError:
            if not replace:
                raise
            old = None
            # Whatever the unreadable file had reserved still runs: stop it before its job folder goes.
            release_without_state(paths.job_dir(name))
        if old is not None:
            d = describe(old)
            alive = d is not None and d.state.alive
            if alive and old.spec.compatible(spec):
                if not old.ready and wait:
                    old = wait_ready(old, path, progress=progress, timeout=timeout)
                return Reservation(old, path, reused=True)
            if alive and not replace:
                raise StateError(
                    f"job {name!r} is already reserved with a different shape: {old.spec.summary()}",
                    f"`monarch stop{_name_flag(name)}` first, or `monarch serve --replace ...`")
            release(old, path)
    record = allocate(spec, name=name, path=path, job_dir=paths.job_dir(name), wait=wait, progress=progress,
                      timeout=timeout)
    return Reservation(record, path, reused=False)


def allocate(spec: JobSpec, *, name: str, path: str, job_dir: str, wait: bool = True, progress: Progress = _quiet,
             timeout: float | None = None, job: bytes | None = None) -> JobRecord:
    """Make a new reservation (no reuse), its state at ``path`` and its files in ``job_dir``.

    The state file is written as soon as the scheduler took the request, so a reservation whose
    client dies while the hosts start can still be found and released.
    """
    make_job_dir(job_dir)
    keys = JobKeys.generate()
    try:
        write_keys(job_dir, keys)
    except BaseException:  # a full disk, say: leave no half-made job folder behind
        _remove_job_dir(job_dir)
        raise
    sched = scheduler_for(spec)
    if hasattr(sched, "start_timeout_s"):  # the local scheduler's launcher: bounded as the agents' start is
        from monarch import config

        sched.start_timeout_s = config.seconds("serve_agent_start_max_idle")
        if wait and timeout is not None:  # serve --timeout bounds the whole start, the launcher's too
            sched.start_timeout_s = min(sched.start_timeout_s, timeout)
    # Before the submission: an agent that starts faster than the scheduler returns (local agents
    # forked from one launcher) must not be taken for one left over from an earlier reservation.
    submitted_at = time.time()
    sched.keys = keys
    try:
        request = sched.dryrun(spec, job_dir)
        progress("submitting", 0, spec.hosts, None)
        job_id = sched.allocate(request)
    except BaseException:
        # A refused submission reserved nothing: leave no keys or half-made job folder behind.
        _remove_job_dir(job_dir)
        raise
    # A scheduler that adopts running agents (kubernetes --attach) replaces the keys with theirs;
    # the file is never read back (what is in memory is what serve made).
    keys = sched.adopted_keys or keys
    from monarch_agents.wire import VERSION as wire_version

    record = JobRecord(name=name, spec=spec, job_id=job_id, job_dir=job_dir, keys=keys, job=job,
                       created_at=submitted_at, wire=wire_version)
    try:
        save_state(path, record)
    except BaseException:
        release(record, None)
        _remove_job_dir(job_dir)
        raise
    if wait:
        try:
            record = wait_ready(record, path, progress=progress, timeout=timeout)
        except BaseException:
            # Ctrl-C or a failed start while waiting: give the hosts back, keep nothing half-made.
            release(record, path)
            raise
    return record


def wait_ready(record: JobRecord, path: str, *, progress: Progress = _quiet, timeout: float | None = None) -> JobRecord:
    """Block until every host agent has reported its address; updates the state file."""
    from monarch import config

    sched = scheduler_for(record)
    deadline = None if timeout is None else time.monotonic() + timeout
    last_describe = 0.0
    describe_every = _DESCRIBE_EVERY_S
    d: Description | None = None
    # Never wait without end for agents that do not come: while the job runs (a queue is the
    # scheduler's to bound, or --timeout's), a stall this long with no new agent up is a failure.
    stall_s = config.seconds("serve_agent_start_max_idle")
    seen, last_new = -1, time.monotonic()
    while True:
        hosts = _read_agents(record)
        if len(hosts) != seen:
            seen, last_new = len(hosts), time.monotonic()
        if len(hosts) == record.spec.hosts:
            record.hosts = hosts
            save_state(path, record)
            progress("ready", len(hosts), record.spec.hosts, d)
            return record
        now = time.monotonic()
        if now - last_describe > describe_every:
            last_describe = now
            d = sched.describe(record.job_id, job_dir=record.job_dir)
            # A queued job can wait for hours: ask the controller less and less often, but look at
            # the agent files as often as ever, so readiness is seen as soon as the job runs.
            pending = d is not None and d.state is HostState.PENDING
            describe_every = min(describe_every * 1.5, _DESCRIBE_PENDING_MAX_S) if pending else _DESCRIBE_EVERY_S
            if d is not None and not d.state.alive:
                logs = sched.logs(record.job_id, job_dir=record.job_dir).strip().splitlines()[-5:]
                raise SchedulerError(
                    f"job {record.job_id} ended before its agents were ready: {d.reason or d.native_state}"
                    + ("; last log lines: " + " | ".join(logs) if logs else ""),
                    f"see `monarch logs --scheduler{_name_flag(record.name)}`")
        phase = "pending" if d is not None and d.state is HostState.PENDING else "starting"
        progress(phase, len(hosts), record.spec.hosts, d)
        if phase == "pending":
            last_new = now
        elif now - last_new > stall_s:
            raise SchedulerError(_stalled(record, sched, hosts, now - last_new),
                                 f"see `monarch logs --scheduler{_name_flag(record.name)}`; "
                                 "MONARCH_SERVE_STALL_TIMEOUT waits longer")
        if deadline is not None and now > deadline:
            raise SchedulerError(f"hosts not ready after {timeout:.0f} s ({len(hosts)}/{record.spec.hosts} agents up)",
                                 f"`monarch status{_name_flag(record.name)}`, or `monarch stop` to give up")
        time.sleep(0.05)


def _stalled(record: JobRecord, sched: Any, hosts: list[HostRecord], idle_s: float) -> str:
    """Why serve gives up on agents that do not come: which hosts, and the scheduler's last log lines."""
    up = {h.host_rank for h in hosts}
    missing = [r for r in range(record.spec.hosts) if r not in up]
    names = ", ".join(f"host{r}" for r in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    try:
        logs = sched.logs(record.job_id, job_dir=record.job_dir).strip().splitlines()[-3:]
    except Exception as e:  # the reason above is what matters; the log is a bonus
        logs = [f"(no scheduler log: {e})"]
    return (f"no new host agent came up in {idle_s:.0f} s while job {record.job_id} runs: "
            f"{len(hosts)}/{record.spec.hosts} up, none yet on {names}"
            + ("; last log lines: " + " | ".join(logs) if logs else ""))


def _read_agents(record: JobRecord) -> list[HostRecord]:
    out = []
    for rank in range(record.spec.hosts):
        try:
            with open(agent_file(record.job_dir, rank)) as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        # published_at: a scheduler that reads the addresses from its API (kubernetes) wrote the file
        # for this reservation, of agents that may have started long before (adopted pods).
        if d.get("published_at", d.get("started_at", 0)) + 1 < record.created_at:
            continue  # left over from an earlier reservation
        out.append(HostRecord(d["host"], d["host_rank"], d["addr"], d["pid"], d.get("ip", ""), d.get("log_dir", "")))
    return out


def load_live(name: str | None = None, *, paths: StatePaths | None = None, wait: bool = True,
              progress: Progress = _quiet, path: str | None = None) -> tuple[JobRecord, str]:
    """The reservation a command should use (``path``, else by name); raises StateError if it is gone."""
    path = path or (paths or StatePaths()).resolve(name)
    record = load_state(path)
    d = describe(record)
    if d is None or not d.state.alive:
        why = d.reason if d is not None and d.reason else "the scheduler no longer knows it"
        raise StateError(f"the reservation {record.name!r} ({record.job_id}) is gone: {why}",
                         f"`monarch serve{_name_flag(record.name)}` to reserve again (or `monarch stop` to clean up)")
    if not record.ready:
        if not wait:
            return record, path
        record = wait_ready(record, path, progress=progress)
    return record, path


def release(record: JobRecord, path: str | None) -> None:
    """Release the hosts and remove the state. Safe to repeat.

    A copy of the state stays in the job folder (``stopped_state.pkl``): its runs' logs stay
    there too, and `monarch logs`, `why` and `query` read them after the stop (:func:`load_for_reading`).
    """
    try:
        if record.spec.scheduler == "slurm" and record.hosts:
            _stop_agents_in_order(record)
        scheduler_for(record).release(record.job_id, job_dir=record.job_dir)
    finally:
        if path:
            _keep_stopped_copy(path, record)
            remove_state(path)


#: How long `monarch stop` waits for a Slurm job's agents to stop in order before scancel.
_ORDERED_STOP_S = 15.0


def _stop_agents_in_order(record: JobRecord, timeout_s: float = _ORDERED_STOP_S) -> None:
    """Ask every agent to stop (a Shutdown through the tree) and wait until each is gone (bounded).

    scancel ends a step's processes together, SIGKILL after Slurm's KillWait: an agent had no
    ordered stop, and left its node's workspace store and mount folder (ws-*, with the user's
    files) in the node's runtime folder, for good.  A stopped agent does it all itself."""
    import threading

    from monarch_agents import messages as m
    from monarch_agents.fanout import fan_out

    hosts = sorted(record.hosts, key=lambda h: h.host_rank)
    try:
        rt = record.runtime()
    except Exception:  # no runtime, no ordered stop: scancel does it as before
        return
    left = {h.addr for h in hosts}
    cond = threading.Condition()

    def gone(addr: str) -> None:
        with cond:
            left.discard(addr)
            cond.notify_all()

    for h in hosts:
        rt.watch(h.addr, lambda _err, addr=h.addr: gone(addr))
        rt.mailbox.connect(h.addr)  # its loss is seen on a connection of ours
    deadline = time.monotonic() + timeout_s
    call = fan_out(rt, [(h.addr, h.host, m.Shutdown(None)) for h in hosts], timeout_s=timeout_s)
    call.wait(timeout_s)
    with cond:
        cond.wait_for(lambda: not left, max(0.0, deadline - time.monotonic()))


#: The state of a stopped reservation, kept in its job folder for reading its runs.
STOPPED_STATE = "stopped_state.pkl"


def _keep_stopped_copy(path: str, record: JobRecord) -> None:
    try:
        if not os.path.isdir(record.job_dir):
            return
        with open(path, "rb") as f:
            data = f.read()
        write_atomic(os.path.join(record.job_dir, STOPPED_STATE), data, durable=False)
    except OSError:
        pass  # only a convenience for reading old runs: the stop itself must not fail for it


@dataclass
class ReadableReservation:
    """A reservation whose runs can be read: live, or stopped (then ``stopped_at`` says when)."""

    record: JobRecord
    path: str
    stopped_at: float | None = None

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def note(self) -> str:
        """The line that says the answer comes from a stopped reservation's folder."""
        import time as _time

        when = _time.strftime("%Y-%m-%d %H:%M", _time.localtime(self.stopped_at or 0))
        return (f"reservation {self.record.name!r} ({self.record.job_id}) was stopped at {when}: "
                "read-only, from its job folder")


def load_for_reading(name: str | None = None, *, paths: StatePaths | None = None) -> ReadableReservation:
    """The live reservation, else the one stopped under that name whose folder is still here."""
    paths = paths or StatePaths()
    path = paths.resolve(name)
    try:
        record, path = load_live(name, paths=paths, path=path)
        return ReadableReservation(record, path)
    except StateError:
        if os.path.exists(path):
            raise  # a state file that is there but unusable: its own error says why
        if os.environ.get("MONARCH_JOB"):
            raise
        from monarch._workbench.state import context_of

        copy = os.path.join(paths.job_dir(context_of(path)), STOPPED_STATE)
        if not os.path.exists(copy):
            raise
        return ReadableReservation(load_state(copy), copy, os.stat(copy).st_mtime)


def _remove_job_dir(job_dir: str) -> None:
    """Remove a job folder, and the ``jobs/`` and ``.monarch/`` above it if this left them empty
    (a first `serve` that failed leaves the directory as it found it)."""
    import shutil  # here: `monarch run` imports this module on every call, and shutil costs ~2 ms

    shutil.rmtree(job_dir, ignore_errors=True)
    jobs = os.path.dirname(os.path.abspath(job_dir))
    for d in (jobs, os.path.dirname(jobs)):
        try:
            os.rmdir(d)  # only if empty: another context's files keep it
        except OSError:
            return


def release_without_state(job_dir: str) -> list[str]:
    """Stop what a reservation left running when its state file cannot be read; says what it did.

    The job folder still names the allocation (``<scheduler>.json`` with its job id, written at
    submission), which its scheduler releases; and a local host agent carries the job folder's
    job folder in its arguments (its address file), so one the record missed is found among this machine's processes.
    """
    from monarch_schedulers import names

    done: list[str] = []
    for sched in names():
        try:
            with open(os.path.join(job_dir, f"{sched}.json")) as f:
                job_id = str(json.load(f)["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        create_scheduler(sched).release(job_id, job_dir=job_dir)
        done.append(f"released {sched} job {job_id}")
    for pid in _local_agents_using(os.path.abspath(job_dir)):
        _terminate(pid)
        done.append(f"stopped host agent pid {pid}")
    return done


def _local_agents_using(job_dir: str) -> list[int]:
    """This user's host agents started for ``job_dir`` (their address file is in it)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline", "uids"]):
        try:
            cmd = p.info["cmdline"] or []
            if p.info["uids"] and p.info["uids"].real != os.getuid():
                continue
        except psutil.Error:
            continue
        if "monarch_agents.host_agent" in cmd and any(a.startswith(job_dir + os.sep) for a in cmd):
            found.append(p.info["pid"])
    return found


def _terminate(pid: int, grace_s: float = 2.0) -> None:
    import psutil

    try:
        p = psutil.Process(pid)
        p.terminate()
        p.wait(grace_s)
    except psutil.TimeoutExpired:
        p.kill()
    except psutil.Error:
        pass


def _name_flag(name: str) -> str:
    return "" if name == "default" else f" --name {name}"


def agent_unreachable(record: JobRecord, host: HostRecord) -> AgentError:
    return AgentError(f"host agent on {host.host} (pid {host.pid}) does not answer",
                      f"`monarch status{_name_flag(record.name)}`; `monarch serve --replace` makes a new reservation")
