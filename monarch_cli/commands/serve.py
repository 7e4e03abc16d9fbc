"""``monarch serve``: reserve hosts (or reuse a live reservation) and start an agent on each."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from monarch.errors import UsageError
from monarch_cli.commands._common import handled, opts
from monarch_cli.output import err, print_json


def serve(
    ctx: typer.Context,
    hosts: Annotated[int, typer.Option("--hosts", help="How many hosts to reserve.", min=1)] = 1,
    procs_per_host: Annotated[int, typer.Option("--procs-per-host", help="Procs per host (torchrun --nproc-per-node).", min=1)] = 1,
    scheduler: Annotated[str, typer.Option("--scheduler", "-s", help="local (default) or slurm.")] = "local",
    name: Annotated[str, typer.Option("--name", "-n", help="Name of this reservation (context).")] = "default",
    partition: Annotated[str | None, typer.Option(help="Slurm partition.")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="Slurm time limit, e.g. 2:00:00.")] = None,
    account: Annotated[str | None, typer.Option(help="Slurm account.")] = None,
    qos: Annotated[str | None, typer.Option(help="Slurm QOS.")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="Slurm GPUs per node.")] = None,
    constraint: Annotated[str | None, typer.Option(help="Slurm node constraint.")] = None,
    exclusive: Annotated[bool, typer.Option(help="Slurm: whole nodes only.")] = False,
    sbatch_arg: Annotated[list[str] | None, typer.Option("--sbatch-arg", help="Extra sbatch argument (repeatable).")] = None,
    client_host: Annotated[str | None, typer.Option("--client-host", help="Slurm: this machine's address as the nodes reach it; agents bind to their route towards it (default: what this host's name resolves to).")] = None,
    bind: Annotated[str | None, typer.Option(help="Address agents bind to (default: loopback for local).")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Release an incompatible or broken reservation and make a new one.")] = False,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Submit and return; a later command waits for the hosts.")] = False,
    dryrun: Annotated[bool, typer.Option("--dryrun", help="Print what would be submitted and exit.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Give up waiting for hosts after this many seconds.")] = None,
) -> None:
    """Reserve hosts and start a monarch agent on each; reuses a live reservation of the same shape."""
    from monarch.job.reserve import reserve
    from monarch.job.state import JobSpec, StatePaths
    o = opts(ctx)
    with handled(ctx):
        options: dict = {}
        if scheduler == "slurm":
            for k, v in {"partition": partition, "time": time_limit, "account": account, "qos": qos,
                         "gpus_per_node": gpus_per_node, "constraint": constraint, "client_host": client_host}.items():
                if v is not None:
                    options[k] = v
            if exclusive:
                options["exclusive"] = True
            if sbatch_arg:
                options["sbatch_args"] = list(sbatch_arg)
        elif any(v is not None for v in (partition, time_limit, account, qos, gpus_per_node, constraint, client_host)) or sbatch_arg:
            raise UsageError(f"Slurm options given with --scheduler {scheduler}", "add --scheduler slurm")
        if bind:
            options["bind"] = bind
        spec = JobSpec(scheduler, hosts, procs_per_host, options)
        paths = StatePaths()
        if dryrun:
            from monarch.job.reserve import scheduler_for

            req = scheduler_for(spec).dryrun(spec, paths.job_dir(name))
            if o.json:
                print_json({"scheduler": req.scheduler, "hosts": req.hosts, "request": req.text})
            else:
                # Plain stdout: the script must be copy-pasteable, not wrapped to the terminal.
                sys.stdout.write(req.text.rstrip("\n") + "\n")
            return
        started = time.monotonic()
        with err.status(f"reserving {spec.summary()} …") as st:
            def progress(phase: str, ready: int, wanted: int, d) -> None:
                if phase == "pending" and d is not None:
                    st.update(f"waiting in queue (job {d.job_id}, {d.native_state}{': ' + d.reason if d.reason else ''}) …")
                elif phase == "starting":
                    st.update(f"starting host agents {ready}/{wanted} …")
            r = reserve(spec, name=name, paths=paths, wait=not no_wait, replace=replace, progress=progress, timeout=timeout)
        paths.set_current(name)
        rec = r.record
        data = {
            "name": rec.name, "job_id": rec.job_id, "scheduler": rec.spec.scheduler, "reused": r.reused,
            "ready": rec.ready, "state_file": r.path, "seconds": round(time.monotonic() - started, 3),
            "hosts": [{"host": h.host, "rank": h.host_rank, "addr": h.addr, "pid": h.pid} for h in rec.hosts],
        }
        if o.json:
            print_json(data)
            return
        verb = "reused" if r.reused else ("submitted" if not rec.ready else "ready")
        where = ", ".join(h.host for h in sorted(rec.hosts, key=lambda h: h.host_rank))
        err.print(f"job [bold]{rec.name!r}[/] {verb}: {rec.spec.summary()}, job {rec.job_id}"
                  + (f": {where}" if where else "") + f"  state: {_rel(r.path)}")
        if not rec.ready:
            err.print("  hosts are still starting; `monarch status` shows progress, and `monarch run` waits for them")


def _rel(path: str) -> str:
    import os

    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path
