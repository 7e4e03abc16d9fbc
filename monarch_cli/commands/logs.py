"""``monarch logs``: output of the last (or a given) run, per rank, optionally followed."""

from __future__ import annotations

import sys
import time

import click

from monarch.errors import UsageError
from monarch_cli.commands._common import name_option, handled, opts
from monarch_cli.output import print_json

_POLL_S = 0.25


@click.command("logs")
@name_option
@click.option("--run", "run_id", help="Run id (default: the last run); see --list.")
@click.option("--rank", type=int, help="Only this rank (host index of the run).")
@click.option("--host", help="Only this host (name).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the run ends.")
@click.option("--stderr", "stderr_only", is_flag=True, help="Show stderr instead of stdout.")
@click.option("--list", "list_runs", is_flag=True, help="List past runs.")
@click.option("--scheduler", "scheduler_logs", is_flag=True, help="Show the scheduler/agent start-up logs.")
@click.pass_context
def logs(ctx: click.Context, name: str | None, run_id: str | None, rank: int | None, host: str | None, follow: bool,
         stderr_only: bool, list_runs: bool, scheduler_logs: bool) -> None:
    """Print a run's output, prefixed by host; -f follows it live."""
    from monarch_agents.messages import ReadLog
    from monarch_agents.client import ensure_runtime
    from monarch.job.reserve import load_live, scheduler_for
    from monarch.job.run import run_history
    from monarch.job.state import StatePaths, load_state
    o = opts(ctx)
    with handled(ctx):
        if scheduler_logs:
            record = load_state(StatePaths().resolve(name))
            sys.stdout.write(scheduler_for(record).logs(record.job_id, job_dir=record.job_dir) + "\n")
            return
        record, _ = load_live(name)
        history = run_history(record)
        if list_runs:
            if o.json:
                print_json(history)
            else:
                for r in history:
                    sys.stdout.write(f"{r['run_id']}  {time.strftime('%H:%M:%S', time.localtime(r['started']))}  {' '.join(r['argv'])}\n")
            return
        if not history:
            raise UsageError("no runs yet on this reservation", "`monarch run -- CMD` starts one")
        entry = history[-1] if run_id is None else next((r for r in history if r["run_id"] == run_id), None)
        if entry is None:
            raise UsageError(f"no run {run_id!r}", "`monarch logs --list` shows the runs")
        by_rank = {h.host_rank: h for h in record.hosts}
        targets = [(i, by_rank[hr]) for i, hr in enumerate(entry["hosts"]) if hr in by_rank]
        if rank is not None:
            targets = [t for t in targets if t[0] == rank]
        if host is not None:
            targets = [t for t in targets if t[1].host == host]
        if not targets:
            raise UsageError("no such rank or host in that run", f"the run used hosts {entry['hosts']}")
        rt = ensure_runtime(record.keys)
        stream = "stderr" if stderr_only else "stdout"
        offsets = {i: 0 for i, _ in targets}
        collected: dict[int, bytes] = {i: b"" for i, _ in targets}
        while True:
            all_done = True
            for i, h in targets:
                res = rt.request(h.addr, lambda port: ReadLog(entry["run_id"], stream, offsets[i], port)).get(timeout=5)
                data, done = res.get(i, (b"", False))
                offsets[i] += len(data)
                all_done &= done
                if o.json:
                    collected[i] += data
                elif data:
                    for line in data.decode(errors="replace").splitlines():
                        sys.stdout.write(f"[{h.host}] {line}\n")
                    sys.stdout.flush()
            if not follow or all_done:
                break
            time.sleep(_POLL_S)
        if o.json:
            print_json({"run_id": entry["run_id"], "stream": stream,
                        "ranks": {str(i): collected[i].decode(errors="replace") for i in collected}})
