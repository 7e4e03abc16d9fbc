"""``monarch logs``: a run's output, whole and byte for byte, optionally followed live."""

from __future__ import annotations

import os
import sys
import time

import click

from monarch.errors import UsageError
from monarch_cli.commands._common import handled, name_option, opts
from monarch_cli.output import err, escape, print_json

_POLL_S = 0.25
_READ_TIMEOUT_S = 10.0
#: How long after a run was recorded its ranks may still be on their way to their hosts (a detached
#: `monarch run` has let go as its messages leave); past it, a rank its host has no record of never started.
_START_GRACE_S = 5.0


@click.command("logs")
@name_option
@click.option("--run", "run_id", help="Run id (default: the last run); see --list.")
@click.option("--rank", type=int, help="Only this rank (host index of the run).")
@click.option("--host", help="Only this host (name).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the run ends.")
@click.option("--stdout", "only_stdout", is_flag=True, help="Only stdout (default: stdout and stderr as they came).")
@click.option("--stderr", "only_stderr", is_flag=True, help="Only stderr.")
@click.option("--prefix/--no-prefix", default=None,
              help="Start each line with [host] (default: when more than one rank is shown; without it, "
                   "the bytes are exactly the rank's).")
@click.option("--list", "list_runs", is_flag=True, help="List past runs with their exit codes and durations.")
@click.option("--scheduler", "scheduler_logs", is_flag=True, help="Show the scheduler/agent start-up logs.")
@click.option("--output", "output_to", metavar="DIR",
              help="Copy what the run's ranks wrote to $MONARCH_OUTPUT_DIR into DIR/<host>/ (the last run, or --run).")
@click.pass_context
def logs(ctx: click.Context, name: str | None, run_id: str | None, rank: int | None, host: str | None, follow: bool,
         only_stdout: bool, only_stderr: bool, prefix: bool | None, list_runs: bool, scheduler_logs: bool,
         output_to: str | None) -> None:
    """Print a run's output: stdout and stderr as they came, every byte; -f follows it live."""
    from monarch._workbench.reserve import scheduler_for
    from monarch._workbench.run import run_history
    from monarch._workbench.state import StatePaths, load_state
    o = opts(ctx)
    with handled(ctx):
        if only_stdout and only_stderr:
            raise UsageError("--stdout and --stderr together are the default", "give one of them, or neither")
        if scheduler_logs:
            record = load_state(StatePaths().resolve(name))
            sys.stdout.write(scheduler_for(record).logs(record.job_id, job_dir=record.job_dir) + "\n")
            return
        from monarch._workbench.reserve import load_for_reading

        readable = load_for_reading(name)
        record = readable.record
        if readable.stopped:
            err.print(f"[yellow]note:[/] {escape(readable.note())}")
            follow = False  # nothing runs any more
        history = run_history(record)
        if list_runs:
            _list(record, history, o.json, ask_agents=not readable.stopped)
            return
        if not history:
            raise UsageError("no runs yet on this reservation", "`monarch run -- CMD` starts one")
        entry = history[-1] if run_id is None else next((r for r in history if r["run_id"] == run_id), None)
        if entry is None:
            raise UsageError(f"no run {run_id!r}", "`monarch logs --list` shows the runs")
        if output_to:
            _fetch_output(record, entry, output_to, o.json)
            return
        targets = _targets(record, entry)
        if rank is not None:
            targets = {i: h for i, h in targets.items() if i == rank}
        if host is not None:
            targets = {i: h for i, h in targets.items() if h == host}
        if not targets:
            raise UsageError("no such rank or host in that run", f"the run has ranks {sorted(_targets(record, entry))}")
        from monarch._workbench.logs import STREAMS, LogReader

        streams = ("stdout",) if only_stdout else ("stderr",) if only_stderr else STREAMS
        fetch = _stopped_fetcher(record, entry) if readable.stopped else _fetcher(record, entry)
        _wait_started(record, entry, targets, fetch, follow)
        reader = LogReader(fetch, sorted(targets), streams)
        show_prefix = len(targets) > 1 if prefix is None else prefix
        if o.json:
            collected: dict[int, dict[str, bytearray]] = {i: {"stdout": bytearray(), "stderr": bytearray(),
                                                               "output": bytearray()} for i in targets}
            for c in (reader.follow(_POLL_S) if follow else reader.poll()):
                collected[c.rank][c.stream] += c.data
                collected[c.rank]["output"] += c.data
            print_json({"run_id": entry["run_id"], "argv": entry["argv"], "streams": list(streams),
                        "ranks": [{"rank": i, "host": targets[i], "complete": reader.ranks[i].done,
                                   **{k: v.decode(errors="replace") for k, v in collected[i].items()}}
                                  for i in sorted(targets)]})
            return
        out = _Printer(targets, show_prefix)
        for c in (reader.follow(_POLL_S) if follow else reader.poll()):
            out.write(c.rank, c.stream, c.data)
        out.flush()


def _wait_started(record, entry: dict, targets: dict[int, str], fetch, follow: bool) -> None:
    """Return once every target rank has a record on its host (with -f, waiting for one about to
    start); raise if a rank's host has none and the run is past starting (so -f never waits forever).

    A run in the history that its host knows nothing of: its `monarch run` was killed before the
    command reached the host, or the host was replaced or its logs removed since.
    """
    from monarch.errors import RunError
    from monarch._workbench.logs import program_run_dir

    def started(rank: int) -> bool:
        if entry.get("kind") == "program":
            return os.path.isdir(program_run_dir(record, entry["run_id"]))
        return bool(fetch(rank, "json", 0)[0])  # the host's start record of the rank, written first

    while True:
        missing = [r for r in sorted(targets) if not started(r)]
        if not missing:
            return
        if time.time() - entry["started"] > _START_GRACE_S:
            where = "this machine" if entry.get("kind") == "program" else ", ".join(targets[r] for r in missing)
            raise RunError(f"run {entry['run_id']} never started on {where}: its host agent has no record of it",
                           "`monarch logs --list` shows the runs; `monarch run -- CMD` starts one")
        if not follow:
            return  # just recorded: nothing to show yet
        time.sleep(_POLL_S)


def _targets(record, entry: dict) -> dict[int, str]:
    """rank (index in the run) -> host name."""
    if entry.get("kind") == "program":
        return {0: "program"}
    by_rank = {h.host_rank: h for h in record.hosts}
    return {i: by_rank[hr].host for i, hr in enumerate(entry["hosts"]) if hr in by_rank}


def _stopped_fetcher(record, entry: dict):
    """A stopped reservation's run, read from the hosts' log folders left in its job folder."""
    from monarch._workbench.logs import local_fetch, program_run_dir

    if entry.get("kind") == "program":
        return local_fetch(program_run_dir(record, entry["run_id"]))
    run = os.path.basename(entry["run_id"])
    per_rank = {i: local_fetch(os.path.join(record.job_dir, "logs", f"host{hr}", "runs", run))
                for i, hr in enumerate(entry["hosts"])}

    def fetch(rank: int, kind: str, offset: int) -> tuple[bytes, bool]:
        data, done = per_rank[rank](rank, kind, offset)
        return data, True  # nothing more will come: the agents are gone

    return fetch


def _fetcher(record, entry: dict):
    from monarch._workbench.logs import local_fetch, program_run_dir

    if entry.get("kind") == "program":
        return local_fetch(program_run_dir(record, entry["run_id"]))
    from monarch._workbench.hosts import read_log
    from monarch._workbench.reserve import agent_unreachable

    by_rank = {h.host_rank: h for h in record.hosts}
    hosts = {i: by_rank[hr] for i, hr in enumerate(entry["hosts"]) if hr in by_rank}

    def fetch(rank: int, kind: str, offset: int) -> tuple[bytes, bool]:
        h = hosts[rank]
        try:
            res = read_log(record, h, entry["run_id"], kind, offset, timeout=_READ_TIMEOUT_S)
        except Exception:
            raise agent_unreachable(record, h) from None
        return res.get(rank, (b"", False))

    return fetch


class _Printer:
    """Chunks to stdout: raw bytes, or whole lines behind a [host] prefix."""

    def __init__(self, targets: dict[int, str], prefix: bool):
        self.names = targets
        self.prefix = prefix
        #: A line not ended yet, as its pieces: joined once when it ends (linear in a long line).
        self.partial: dict[tuple[int, str], list[bytes]] = {}
        self.out = sys.stdout.buffer

    def write(self, rank: int, stream: str, data: bytes) -> None:
        if not self.prefix:
            self.out.write(data)
            self.out.flush()
            return
        key = (rank, stream)
        *lines, rest = data.split(b"\n")
        if lines and key in self.partial:
            lines[0] = b"".join([*self.partial.pop(key), lines[0]])
        prefix = f"[{self.names[rank]}] ".encode()
        if lines:
            self.out.write(b"".join(prefix + line + b"\n" for line in lines))
        if rest:
            self.partial.setdefault(key, []).append(rest)
        self.out.flush()

    def flush(self) -> None:
        for (rank, _), pieces in self.partial.items():
            self.out.write(f"[{self.names[rank]}] ".encode() + b"".join(pieces) + b"\n")
        self.partial.clear()
        self.out.flush()


def output_dirs(record, entry: dict) -> dict[str, str]:
    """host -> the folder its rank(s) of the run wrote as $MONARCH_OUTPUT_DIR, as this machine sees it
    (the job folder: the hosts' log folders are there for local and Slurm hosts alike)."""
    from monarch._workbench.logs import program_run_dir

    if entry.get("kind") == "program":
        return {"client": os.path.join(program_run_dir(record, entry["run_id"]), "output")}
    by_rank = {h.host_rank: h.host for h in record.hosts}
    run = os.path.basename(entry["run_id"])
    return {by_rank.get(hr, f"host{hr}"): os.path.join(record.job_dir, "logs", f"host{hr}", "runs", run, "output")
            for hr in entry.get("hosts") or []}


def _files_under(path: str) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def _fetch_output(record, entry: dict, dest: str, as_json: bool) -> None:
    import shutil

    from monarch.errors import RunError

    copied, unseen = {}, []
    for host, src in output_dirs(record, entry).items():
        if not os.path.isdir(src):
            unseen.append(host)
            continue
        target = os.path.join(dest, host)
        shutil.copytree(src, target, dirs_exist_ok=True, symlinks=True)
        copied[host] = len(_files_under(src))
    if not copied:
        raise RunError(f"no output of run {entry['run_id']} is visible from this machine "
                       f"(hosts: {', '.join(unseen)})", "its ranks write to $MONARCH_OUTPUT_DIR on their hosts")
    if as_json:
        print_json({"run_id": entry["run_id"], "dest": os.path.abspath(dest), "files": copied, "not_visible": unseen})
        return
    for host, n in copied.items():
        err.print(f"{host}: {n} file{'s' if n != 1 else ''} -> {os.path.join(dest, host)}")
    for host in unseen:
        err.print(f"[yellow]warning:[/] {host}: its output folder is not visible from this machine")


def _list(record, history: list[dict], as_json: bool, ask_agents: bool = True) -> None:
    rows = []
    for r in history:
        if "exit_code" not in r and ask_agents:
            _ask_agents_how_it_ended(record, r)
        ended = r.get("ended")
        unknown = r.get("exit_unknown")
        rows.append({"run_id": r["run_id"], "kind": r.get("kind", "command"), "argv": r["argv"],
                     "started": r["started"], "ended": ended, "exit_code": r.get("exit_code"),
                     "duration_s": round(ended - r["started"], 3) if ended else None,
                     "running": ended is None and not unknown and ask_agents,
                     # $MONARCH_OUTPUT_DIR of each host, and how many files its ranks left there
                     "output": {h: {"dir": d, "files": len(_files_under(d))} for h, d in output_dirs(record, r).items()
                                if os.path.isdir(d)},
                     **({"exit_unknown": unknown} if unknown else {})})
    if as_json:
        print_json(rows)
        return
    for r in rows:
        code = "running" if r["running"] else f"exit {r['exit_code']}" if r["exit_code"] is not None else "exit ?"
        took = f"{r['duration_s']:.1f}s" if r["duration_s"] is not None else "-"
        when = time.strftime("%H:%M:%S", time.localtime(r["started"]))
        why = f"  ({r['exit_unknown']})" if r.get("exit_unknown") else ""
        files = sum(o["files"] for o in r["output"].values())
        kept = f"  [{files} output file{'s' if files != 1 else ''}: --run {r['run_id']} --output DIR]" if files else ""
        sys.stdout.write(f"{r['run_id']}  {when}  {code:>8}  {took:>8}  {' '.join(r['argv'])}{why}{kept}\n")


def _ask_agents_how_it_ended(record, run: dict) -> None:
    """A run this command did not see end (detached, or its `monarch run` was killed): its ranks'
    exit files say; noted in the history so the next --list need not ask.

    A rank without an exit file is still running (or its agent is gone): the run shows as running.
    One whose exit file is there but unreadable (damaged) ended in a way nobody can tell: the run
    shows "exit ?" with the reason, and is not noted, so a later --list looks again.
    """
    from monarch._workbench.exit_status import exit_status
    from monarch._workbench.logs import RankExit
    from monarch._workbench.run import record_run_end

    fetch = _fetcher(record, run)
    exits = []
    damaged = []
    for rank, host in _targets(record, run).items():
        try:
            data, done = fetch(rank, "exit", 0)
        except Exception:
            return  # its agent is gone: unknown for now
        if not done:
            return  # still running
        parsed = RankExit.parse(data)
        if parsed is None:
            damaged.append(f"rank {rank} on {host}")
        else:
            exits.append(parsed)
    if damaged:
        run["exit_unknown"] = f"unreadable exit file of {', '.join(damaged)}"
        return
    if not exits:
        return
    failed = sorted((e for e in exits if e.code != 0), key=lambda e: e.ended)
    code = exit_status(failed[0].code) if failed else 0
    ended = max(e.ended for e in exits)
    run.update(exit_code=code, ended=ended)
    record_run_end(record, run["run_id"], code, ended)
