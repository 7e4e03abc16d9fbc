"""The Slurm scheduler: one ``sbatch`` job per reservation, one host agent per node.

Prerequisites:

* the Slurm client commands (``sbatch``, ``squeue``, ``scancel``; ``sacct`` is
  optional) on ``PATH`` of the machine that runs ``monarch``, talking to the
  cluster (``SLURM_CONF`` or the site's configuration);
* a filesystem shared by that machine and the compute nodes holding the working
  directory (the job directory ``.monarch/jobs/<name>/``), this checkout and its
  Python (``sys.executable`` is what the nodes run);
* compute nodes that can reach the address in ``client_host`` (the agents bind
  to their route towards it; default: the address this machine uses to reach
  the cluster's nodes (their ``NodeAddr`` in ``sinfo``), else what its name
  resolves to, else 127.0.0.1).

The job is an ``sbatch`` batch script (``serve --dryrun`` prints it) whose one
``srun`` step starts ``python -m monarch_agents.host_agent`` once per node, with the
node's ``$SLURM_NODEID`` as host rank and ``$SLURMD_NODENAME`` as host name.
Each agent writes its address to ``<job_dir>/agents/<rank>.json``, which
``monarch serve`` waits for.  The allocation outlives the ``monarch`` command
that made it; ``monarch stop`` runs ``scancel``.

Logs: the batch script's output goes to ``<job_dir>/logs/slurm-<jobid>.out``,
each node's agent output to ``<job_dir>/logs/host<rank>/agent.log`` (also
where the agent keeps its own logs); ``monarch logs --scheduler`` shows both.

Time limit: ``monarch status`` shows the time left, and ``monarch run`` warns once when the
job is within ``--warn-before``/``MONARCH_WARN_BEFORE`` minutes (default 5) of it.  A job that
ends under a run (time limit, ``scancel``, node failure) fails the run with the reason; the
next ``monarch serve`` replaces it.

Options (``JobSpec.options``; ``monarch serve`` flags of the same names):
``partition``, ``time``, ``account``, ``qos``, ``gpus_per_node``,
``constraint``, ``exclusive``, ``sbatch_args`` (extra ``#SBATCH`` arguments),
``client_host``, ``bind`` (the agents' bind address, instead of the route to
``client_host``) and ``python`` (the interpreter the nodes run; default: this one).

    $ monarch serve --scheduler slurm --hosts 4 --partition debug --time 1:00:00
    $ squeue --me                          # the job: monarch-default
    $ monarch run -- hostname              # runs on the 4 nodes
    $ monarch logs --scheduler             # slurm-<id>.out and each agent's log
    $ monarch stop                         # scancel
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from typing import Any

from monarch_agents.files import private_dir
from monarch_schedulers.errors import SchedulerError, UsageError
from monarch_schedulers.agent_launch import agent_argv, project_root
from monarch_schedulers.base import AllocateRequest, Description, HostState, JobSpec, Scheduler

#: Expanded on each node by the bash that srun starts there: the host rank and the host name.
_NODE_VARS = ("SLURM_NODEID", "SLURMD_NODENAME")
#: squeue's fields: state, reason, time left, nodelist.
_SQUEUE_FORMAT = "%T|%r|%L|%N"
#: How long one Slurm command may take (they retry an unreachable controller for a while themselves).
_CMD_TIMEOUT_S = 60.0
#: How long ``sinfo`` may take to name the nodes' addresses for the default client host (a
#: controller that is down makes it retry; sbatch then says why, so the default gives up sooner).
_NODE_ADDR_TIMEOUT_S = 10.0
#: How long ``release`` waits for the job to leave the queue (its agents gone), and how often it looks.
_RELEASE_WAIT_S = 10.0
_RELEASE_POLL_S = 0.1

#: Every Slurm job state monarch knows: what it means for the hosts, and why, in words.
#: (``squeue --help``/``man squeue`` JOB STATE CODES; states not listed map to UNKNOWN.)
STATES: dict[str, tuple[HostState, str]] = {
    "PENDING": (HostState.PENDING, ""),
    "CONFIGURING": (HostState.PENDING, "nodes are being configured (booting)"),
    "REQUEUED": (HostState.PENDING, "requeued"),
    "REQUEUE_HOLD": (HostState.PENDING, "requeued and held"),
    "REQUEUE_FED": (HostState.PENDING, "requeued (federation)"),
    "RESV_DEL_HOLD": (HostState.PENDING, "held: its reservation was deleted"),
    "SUSPENDED": (HostState.PENDING, "suspended"),
    "RUNNING": (HostState.RUNNING, ""),
    # squeue shows COMPLETING over the job's final state while its nodes clean up: the hosts are
    # going away, so a COMPLETING job is never reused or waited for.
    "COMPLETING": (HostState.ENDED, "ending (Slurm is cleaning up its nodes)"),
    "SIGNALING": (HostState.RUNNING, "being signaled"),
    "STAGE_OUT": (HostState.RUNNING, "staging out"),
    "RESIZING": (HostState.RUNNING, "resizing"),
    "STOPPED": (HostState.RUNNING, "stopped (SIGSTOP)"),
    "COMPLETED": (HostState.ENDED, "completed: every host agent exited"),
    "CANCELLED": (HostState.FAILED, "cancelled (scancel or admin)"),
    "TIMEOUT": (HostState.FAILED, "hit its time limit"),
    "DEADLINE": (HostState.FAILED, "hit its deadline"),
    "NODE_FAIL": (HostState.FAILED, "a node failed"),
    "BOOT_FAIL": (HostState.FAILED, "a node failed to boot"),
    "FAILED": (HostState.FAILED, "the batch script failed (see `monarch logs --scheduler`)"),
    "PREEMPTED": (HostState.FAILED, "preempted by another job"),
    "OUT_OF_MEMORY": (HostState.FAILED, "ran out of memory"),
    "REVOKED": (HostState.FAILED, "revoked (federation)"),
    "SPECIAL_EXIT": (HostState.FAILED, "ended with a special exit"),
}

#: The commonest reasons a job waits, in words (``squeue %r``); others are shown as Slurm spells them.
PENDING_REASONS = {
    "Resources": "waiting for free nodes",
    "Priority": "other jobs are ahead in the queue",
    "PartitionConfig": "the partition cannot run this shape (too many nodes, GPUs or time?)",
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionTimeLimit": "longer than the partition's time limit",
    "ReqNodeNotAvail": "requested nodes are unavailable",
    "BeginTime": "not before its begin time",
    "Dependency": "waiting for a dependency",
    "JobHeldUser": "held by the user",
    "JobHeldAdmin": "held by an admin",
    "QOSMaxJobsPerUserLimit": "QOS limit on jobs per user",
    "AssocGrpCPULimit": "the account's CPU limit is reached",
    "AssocGrpGRES": "the account's GPU limit is reached",
}

#: Why a job that is COMPLETING ends (``squeue %r``), for the reasons that matter to its hosts.
ENDING_REASONS = {
    "TimeLimit": "hit its time limit",
    "NodeDown": "a node failed",
    "DeadLine": "hit its deadline",
}

OPTIONS = ("partition", "time", "account", "qos", "gpus_per_node", "constraint", "exclusive", "sbatch_args",
           "client_host", "bind", "python")


# -- parsers (pure) -----------------------------------------------------------------------------


def parse_time(text: str) -> float | None:
    """Seconds in a Slurm time (``squeue %L``, ``--time``); None for no limit or not set.

    Slurm writes ``MM:SS``, ``HH:MM:SS`` and ``D-HH:MM:SS`` and also accepts
    ``MM``, ``D-HH`` and ``D-HH:MM``; ``UNLIMITED``/``INFINITE``/``NOT_SET``/
    ``INVALID`` have no number.  Raises ValueError for anything else.
    """
    s = text.strip()
    if s.upper() in ("UNLIMITED", "INFINITE", "NOT_SET", "INVALID", "N/A", ""):
        return None
    days = 0
    if "-" in s:
        d, s = s.split("-", 1)
        if not d.isdigit():
            raise ValueError(f"not a Slurm time: {text!r}")
        days = int(d)
        parts = s.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"not a Slurm time: {text!r}")
        h, m, sec = (int(p) for p in parts + ["0"] * (3 - len(parts)))
    else:
        parts = s.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"not a Slurm time: {text!r}")
        if len(parts) == 1:
            h, m, sec = 0, int(parts[0]), 0
        elif len(parts) == 2:
            h, m, sec = 0, int(parts[0]), int(parts[1])
        else:
            h, m, sec = (int(p) for p in parts)
    return float(((days * 24 + h) * 60 + m) * 60 + sec)


def expand_nodelist(text: str) -> list[str]:
    """``n[1-3,5],gpu[01-02]-a`` -> ``['n1', 'n2', 'n3', 'n5', 'gpu01-a', 'gpu02-a']`` (zero padding kept)."""
    out: list[str] = []
    for item in _split_top(text.strip()):
        out.extend(_expand_one(item))
    return out


def _split_top(text: str) -> list[str]:
    items, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in nodelist {text!r}")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in nodelist {text!r}")
    items.append("".join(cur))
    return [i for i in (x.strip() for x in items) if i]


def _expand_one(item: str) -> list[str]:
    lb = item.find("[")
    if lb < 0:
        return [item]
    rb = item.index("]", lb)
    prefix, ranges, rest = item[:lb], item[lb + 1:rb], item[rb + 1:]
    tails = _expand_one(rest)
    out = []
    for r in ranges.split(","):
        r = r.strip()
        if "-" in r:
            lo, hi = r.split("-", 1)
            width = len(lo)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {r!r} in nodelist {item!r}")
            nums = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        else:
            if not r.isdigit():
                raise ValueError(f"bad range {r!r} in nodelist {item!r}")
            nums = [r]
        out.extend(prefix + n + t for n in nums for t in tails)
    return out


def parse_job_id(stdout: str) -> str:
    """The job id ``sbatch --parsable`` printed: ``1234`` or ``1234;cluster``."""
    for line in stdout.splitlines():
        job_id = line.split(";", 1)[0].strip()
        if re.fullmatch(r"\d+(_\d+)?", job_id):
            return job_id
    raise SchedulerError(f"sbatch printed no job id: {_one_line(stdout) or '(nothing)'}",
                         "run the script by hand (`monarch serve --dryrun ...`) to see what sbatch says")


def describe_native(job_id: str, state: str, reason: str = "", time_left: str = "", nodelist: str = "") -> Description:
    """A Description from Slurm's own words for a job (squeue's or sacct's fields)."""
    native = state.strip().split()[0].upper() if state.strip() else ""
    native = native.rstrip("+")  # sacct writes CANCELLED+ when the cancel came from another user
    host_state, why = STATES.get(native, (HostState.UNKNOWN, f"unknown Slurm state {native or '(empty)'}"))
    reason = reason.strip()
    if reason in ("None", "(null)"):
        reason = ""
    if host_state is HostState.PENDING and reason:
        words = PENDING_REASONS.get(reason)
        why = f"{reason}: {words}" if words else reason
    elif host_state is HostState.FAILED and reason and native not in ("CANCELLED", "TIMEOUT"):
        why = f"{why} ({reason})"
    elif native == "COMPLETING" and reason in ENDING_REASONS:
        # The final state is hidden behind COMPLETING, but the reason still says why it ends.
        host_state, why = HostState.FAILED, f"ending: {ENDING_REASONS[reason]}"
    left = None
    if host_state.alive and time_left:
        try:
            left = parse_time(time_left)
        except ValueError:
            left = None
        # %L is INVALID once a running job is past its limit: Slurm ends it at its next time check
        # (every 30 s), and until then squeue still says RUNNING.
        if left is None and native == "RUNNING" and time_left.strip().upper() == "INVALID":
            left = 0.0
            why = "past its time limit: Slurm is about to end it"
    nodes: list[str] = []
    if nodelist.strip() and not nodelist.strip().startswith("("):
        try:
            nodes = expand_nodelist(nodelist)
        except ValueError:
            nodes = [nodelist.strip()]
    return Description(job_id, host_state, reason=why, native_state=native, nodes=nodes, time_left_s=left)


# -- the scheduler ------------------------------------------------------------------------------


class SlurmScheduler(Scheduler):
    """Hosts are the nodes of one Slurm batch job (see the module docstring for prerequisites)."""

    name = "slurm"

    def __init__(self, client_host: str | None = None, python: str | None = None):
        self.client_host = client_host
        self.python = python or sys.executable

    # dryrun ---------------------------------------------------------------------------------

    def dryrun(self, spec: JobSpec, job_dir: str) -> AllocateRequest:
        job_dir = os.path.abspath(job_dir)
        opts = dict(spec.options or {})
        unknown = sorted(set(opts) - set(OPTIONS))
        if unknown:
            raise UsageError(f"unknown Slurm option(s): {', '.join(unknown)}", f"use any of: {', '.join(OPTIONS)}")
        if not isinstance(spec.hosts, int) or spec.hosts < 1:
            raise UsageError(f"need at least one host, got {spec.hosts!r}", "--hosts N with N >= 1")
        n = spec.hosts
        name = os.path.basename(job_dir.rstrip(os.sep)) or "job"
        logs = os.path.join(job_dir, "logs")

        sb = [f"--job-name=monarch-{name}", f"--nodes={n}", "--ntasks-per-node=1",
              f"--output={_q(os.path.join(logs, 'slurm-%j.out'))}"]
        for key in ("partition", "time", "account", "qos"):
            v = opts.get(key)
            if v is None or v == "":
                continue
            if key == "time":
                try:
                    parse_time(str(v))
                except ValueError:
                    raise UsageError(f"bad Slurm time limit {v!r}",
                                     "use MM, MM:SS, HH:MM:SS or D-HH:MM:SS, e.g. --time 2:00:00") from None
            sb.append(f"--{key}={_q(str(v))}")
        if opts.get("gpus_per_node") is not None:
            g = opts["gpus_per_node"]
            if isinstance(g, bool) or not isinstance(g, (int, str)) or not str(g).strip():
                raise UsageError(f"bad gpus_per_node {g!r}", "a number of GPUs (or type:number), e.g. 8")
            sb.append(f"--gpus-per-node={_q(str(g))}")
        if opts.get("constraint"):
            sb.append(f"--constraint={_q(str(opts['constraint']))}")
        if opts.get("exclusive"):
            sb.append("--exclusive")
        extra = opts.get("sbatch_args") or []
        if isinstance(extra, str) or not all(isinstance(a, str) for a in extra):
            raise UsageError(f"sbatch_args must be a list of strings, got {extra!r}", "e.g. ['--mem=64G']")
        sb.extend(_group_args(extra))

        client_host = opts.get("client_host") or self.client_host or default_client_host()
        if not isinstance(client_host, str) or not re.fullmatch(r"[A-Za-z0-9_.:%-]+", client_host):
            raise UsageError(f"bad client host {client_host!r}",
                             "an address or host name the compute nodes can reach, e.g. --client-host 10.0.0.5")
        agent_file = os.path.join(job_dir, "agents", "$SLURM_NODEID.json")
        log_dir = os.path.join(logs, "host$SLURM_NODEID")
        agent = agent_argv(job_dir, python=str(opts.get("python") or self.python), preload=self.agent_preload, extra=[
            "--host-rank", "$SLURM_NODEID", "--hostname", "$SLURMD_NODENAME",
            "--client-host", client_host, *(["--bind", str(opts["bind"])] if opts.get("bind") else []),
            "--agent-file", agent_file, "--log-dir", log_dir,
        ])
        inner = "exec " + " ".join(_dq(a, keep_vars=_NODE_VARS) for a in agent)
        root = project_root()
        lines = ["#!/bin/bash", *(f"#SBATCH {a}" for a in sb),
                 "#",
                 "# Written by monarch (monarch_schedulers/slurm.py). One host agent per node; each writes its",
                 f"# address to {job_dir}/agents/<node id>.json. `monarch stop` (scancel) ends the job.",
                 "set -eu",
                 "umask 077  # what the agents and srun's --output make is private (keys, logs, chunks)",
                 f"export PYTHONPATH={shlex.quote(root)}${{PYTHONPATH:+:$PYTHONPATH}}",
                 "# Each agent gets every CPU the job holds on its node (a step's default is one per task).",
                 "cpus=$(tr ',' '\\n' <<<\"$SLURM_JOB_CPUS_PER_NODE\" | sed 's/(.*//' | sort -n | head -n1)",
                 f"srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --cpus-per-task=\"$cpus\" \\",
                 f"    --output={_dq(os.path.join(logs, 'host%n', 'agent.log'))} \\",
                 f"    bash -c {shlex.quote(inner)}",
                 ""]
        return AllocateRequest("slurm", job_dir, n, "\n".join(lines), payload={"name": name})

    # allocate -------------------------------------------------------------------------------

    def allocate(self, request: AllocateRequest) -> str:
        job_dir = request.job_dir
        private_dir(os.path.join(job_dir, "agents"), top=job_dir)
        # Slurm opens --output files but does not make their folders.
        for i in range(request.hosts):
            private_dir(os.path.join(job_dir, "logs", f"host{i}"), top=job_dir)
        script = os.path.join(job_dir, "slurm.sbatch")
        with open(script, "w") as f:
            f.write(request.text)
        r = _run(["sbatch", "--parsable", script])
        if r.returncode != 0:
            msg = _one_line(r.stderr) or _one_line(r.stdout) or f"exit status {r.returncode}"
            raise SchedulerError(f"sbatch refused the job: {msg}", _sbatch_hint(msg))
        job_id = parse_job_id(r.stdout)
        with open(os.path.join(job_dir, "slurm.json"), "w") as f:
            json.dump({"job_id": job_id, "script": script, "submitted_at": time.time()}, f)
        return job_id

    # describe -------------------------------------------------------------------------------

    def describe(self, job_id: str, job_dir: str | None = None) -> Description:
        # -t all: a job that just ended stays listed (MinJobAge) with the state that says why.
        r = _run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", _SQUEUE_FORMAT])
        if r.returncode == 0 and r.stdout.strip():
            fields = r.stdout.strip().splitlines()[0].split("|")
            fields += [""] * (4 - len(fields))
            return describe_native(str(job_id), *fields[:4])
        if r.returncode != 0 and not _invalid_job(r.stderr):
            raise SchedulerError(f"squeue failed: {_one_line(r.stderr) or f'exit status {r.returncode}'}",
                                 "is the Slurm controller reachable? try `sinfo`")
        # squeue has forgotten the job: ask accounting, where there is one.
        r = _run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "State,ExitCode"], missing_ok=True)
        if r.returncode == 0 and r.stdout.strip():
            state, _, code = r.stdout.strip().splitlines()[0].partition("|")
            d = describe_native(str(job_id), state)
            if d.native_state == "FAILED" and code:
                d.reason = f"{d.reason} (exit code {code})"
            return d
        return Description(str(job_id), HostState.ENDED, reason="job left the queue", native_state="")

    # release --------------------------------------------------------------------------------

    def release(self, job_id: str, job_dir: str | None = None) -> None:
        r = _run(["scancel", str(job_id)])
        if r.returncode != 0 and not _invalid_job(r.stderr) and "already completing" not in r.stderr.lower():
            raise SchedulerError(f"scancel {job_id} failed: {_one_line(r.stderr) or f'exit status {r.returncode}'}",
                                 f"check with `squeue -j {job_id}`; `scancel {job_id}` by hand")
        # The default squeue listing holds only jobs not yet done: once it is gone, so are the agents.
        deadline = time.monotonic() + _RELEASE_WAIT_S
        while time.monotonic() < deadline:
            q = _run(["squeue", "-h", "-j", str(job_id), "-o", "%T"])
            if (q.returncode == 0 and not q.stdout.strip()) or _invalid_job(q.stderr):
                return
            if q.returncode != 0:
                return  # the controller does not answer; scancel was accepted, nothing better to do
            time.sleep(_RELEASE_POLL_S)

    # logs -----------------------------------------------------------------------------------

    def logs(self, job_id: str, host: int | None = None, job_dir: str | None = None) -> str:
        job_dir = job_dir or _job_dir_for(str(job_id))
        if not job_dir:
            return ""
        logs = os.path.join(job_dir, "logs")
        out = []
        if host is None:
            text = _read(os.path.join(logs, f"slurm-{job_id}.out"))
            if text is not None:
                out.append(f"== slurm-{job_id}.out ==\n{text}")
        try:
            names = sorted(os.listdir(logs), key=_host_key)
        except OSError:
            names = []
        for name in names:
            if not name.startswith("host") or (host is not None and name != f"host{host}"):
                continue
            # A capped agent.log's lines before its last rotation are in agent.log.1 (monarch_agents.logcap).
            older = _read(os.path.join(logs, name, "agent.log.1"))
            text = _read(os.path.join(logs, name, "agent.log"))
            if older is not None and text is not None:
                text = older + text
            if text is not None:
                out.append(f"== {name} ==\n{text}")
        return "\n".join(out)


# -- helpers ------------------------------------------------------------------------------------


def default_client_host() -> str:
    """This machine's address as the nodes see it: the one it uses to reach them.

    Its own name is no guide: Debian maps it to 127.0.1.1, containers to
    127.0.0.1, and a machine on several networks has several addresses.  So the
    kernel is asked which local address routes to the first node ``sinfo`` lists
    (``NodeAddr``); without an answer, what this machine's name resolves to, else
    loopback.
    """
    from monarch_agents.transport import route_ip

    for addr in _node_addrs():
        try:
            return route_ip(socket.gethostbyname(addr), fallback=None)
        except OSError:
            continue
    try:
        ip = socket.gethostbyname(socket.gethostname())
        ipaddress.ip_address(ip)
        return ip
    except (OSError, ValueError):
        return "127.0.0.1"


def _node_addrs() -> list[str]:
    """The nodes' addresses (``NodeAddr``) as the controller knows them; [] when it does not answer."""
    try:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%o"], capture_output=True, text=True,
                           timeout=_NODE_ADDR_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if r.returncode != 0:
        return []
    return list(dict.fromkeys(a for a in r.stdout.split() if a and a != "(null)"))


def _q(s: str) -> str:
    """Quote an ``#SBATCH`` value only where needed (sbatch strips quotes like a shell)."""
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dq(s: str, keep_vars: tuple[str, ...] = ()) -> str:
    """``s`` for bash: as is where safe, else double-quoted; only ``$V`` for V in ``keep_vars`` expands."""
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", s):
        return s
    out = []
    for part in re.split(r"(\$[A-Za-z_][A-Za-z0-9_]*)", s):
        if part[1:] in keep_vars and part.startswith("$"):
            out.append(part)
        else:
            out.append(re.sub(r'([\\"`$])', r"\\\1", part))
    return '"' + "".join(out) + '"'


def _group_args(args: list[str]) -> list[str]:
    """``['--mem', '4G', '--gres=gpu:1']`` -> ``['--mem 4G', '--gres=gpu:1']``: one option a line."""
    out: list[str] = []
    for a in args:
        if a.startswith("-") or not out:
            out.append(_q(a) if not a.startswith("-") else _quote_opt(a))
        else:
            out[-1] += " " + _q(a)
    return out


def _quote_opt(a: str) -> str:
    flag, eq, value = a.partition("=")
    return f"{flag}={_q(value)}" if eq else a


def _run(argv: list[str], missing_ok: bool = False) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        if missing_ok:
            return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: not found")
        raise SchedulerError(f"{argv[0]} not found: the Slurm client commands are not on PATH",
                             "run monarch on a Slurm login node, or install the Slurm client (slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{argv[0]} did not answer within {_CMD_TIMEOUT_S:.0f} s",
                             "is the Slurm controller reachable? try `sinfo`") from None


def _invalid_job(stderr: str) -> bool:
    return "invalid job id" in stderr.lower()


def _one_line(text: str) -> str:
    """Slurm's messages on one line, without the ``sbatch: error:`` prefixes."""
    lines = []
    for line in (text or "").splitlines():
        line = re.sub(r"^(sbatch|squeue|scancel|sacct|srun|slurm_load_jobs)?:?\s*(error|fatal)?:\s*", "", line.strip())
        if line and line not in lines:
            lines.append(line)
    return "; ".join(lines)


def _sbatch_hint(msg: str) -> str:
    m = msg.lower()
    if "configuration source" in m or "contact slurm controller" in m:
        return "no Slurm controller answers from here: set SLURM_CONF or run on a login node; `sinfo` checks"
    if "partition" in m:
        return "`sinfo -s` lists the partitions (--partition)"
    if "time limit" in m:
        return "`sinfo -o '%P %l'` shows each partition's time limit (--time)"
    if "account" in m or "qos" in m or "association" in m:
        return "`sacctmgr show assoc user=$USER` lists your accounts and QOS (--account, --qos)"
    if "node count" in m or "node configuration" in m or "gres" in m or "constraint" in m or "feature" in m:
        return "ask for what the nodes have: `sinfo -N -o '%N %c %G %f'` (--hosts, --gpus-per-node, --constraint)"
    return "`monarch serve --dryrun --scheduler slurm ...` prints the script; `sbatch` it by hand to see more"


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _host_key(name: str) -> tuple:
    m = re.fullmatch(r"host(\d+)", name)
    return (0, int(m.group(1))) if m else (1, name)


def _job_dir_for(job_id: str) -> str | None:
    root = os.path.join(os.getcwd(), ".monarch", "jobs")
    try:
        dirs = [os.path.join(root, d) for d in sorted(os.listdir(root))]
    except OSError:
        return None
    for d in dirs:
        try:
            with open(os.path.join(d, "slurm.json")) as f:
                if json.load(f).get("job_id") == job_id:
                    return d
        except (OSError, ValueError):
            continue
    return None


def create_scheduler(**opts: Any) -> SlurmScheduler:
    return SlurmScheduler(**opts)
