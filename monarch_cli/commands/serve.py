"""``monarch serve``: reserve hosts (or reuse a live reservation) and start an agent on each."""

from __future__ import annotations

import os
import sys
import time

import click

from monarch.errors import UsageError
from monarch_cli.commands._common import handled, opts
from monarch_cli.output import err, escape, print_json


@click.command("serve")
@click.option("--hosts", type=click.IntRange(min=1), default=1, show_default=True, help="How many hosts to reserve.")
@click.option("--procs-per-host", type=click.IntRange(min=1), default=1, show_default=True,
              help="Procs per host (torchrun --nproc-per-node).")
@click.option("--scheduler", "-s", default="local", show_default=True, help="local, slurm or kubernetes.")
@click.option("--name", "-n", default="default", show_default=True, help="Name of this reservation (context).")
@click.option("--partition", help="Slurm partition.")
@click.option("--time", "time_limit", help="Slurm time limit, e.g. 2:00:00.")
@click.option("--account", help="Slurm account.")
@click.option("--qos", help="Slurm QOS.")
@click.option("--gpus-per-node", type=int, help="Slurm GPUs per node.")
@click.option("--constraint", help="Slurm node constraint.")
@click.option("--exclusive/--no-exclusive", default=False, help="Slurm: whole nodes only.")
@click.option("--sbatch-arg", multiple=True, help="Extra sbatch argument (repeatable).")
@click.option("--client-host", help="Slurm: this machine's address as the nodes reach it; agents bind to their route "
                                    "towards it (default: the address this machine uses to reach the nodes).")
@click.option("--bind", help="Address agents bind to (default: loopback for local).")
@click.option("--image", help="Kubernetes: the image the pods run (Python and monarch installed).")
@click.option("--namespace", help="Kubernetes namespace (default: default).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Kubernetes config file (default: $KUBECONFIG).")
@click.option("--context", "kube_context", help="Kubernetes config context.")
@click.option("--gpus-per-host", type=click.IntRange(min=1), help="Kubernetes: nvidia.com/gpu per pod.")
@click.option("--cpu", help="Kubernetes: CPU per pod, e.g. 8.")
@click.option("--memory", help="Kubernetes: memory per pod, e.g. 64Gi.")
@click.option("--node-selector", multiple=True, metavar="K=V", help="Kubernetes node selector (repeatable).")
@click.option("--toleration", multiple=True, metavar="KEY[=VALUE]:EFFECT",
              help="Kubernetes toleration, e.g. nvidia.com/gpu:NoSchedule (repeatable).")
@click.option("--service-account", help="Kubernetes service account of the pods.")
@click.option("--pod-template", type=click.Path(exists=True, dir_okay=False),
              help="Kubernetes: a pod (or pod template) YAML merged under monarch's worker container.")
@click.option("--attach", help="Kubernetes: adopt running agent pods of this mesh name instead of creating pods.")
@click.option("--reach", type=click.Choice(["auto", "direct", "port-forward"]),
              help="Kubernetes: how this machine reaches the pods: their IPs (direct), or port-forward streams "
                   "through the API server, for a client outside the cluster (default: auto, direct if the "
                   "pods' IPs answer).")
@click.option("--output", "-o", type=click.Choice(["yaml", "text"]), help="With --dryrun: the request's format.")
@click.option("--netns", is_flag=True, help="Local: each host in its own network namespace with its own address "
                                            "(root only), as hosts of a real cluster; removed on stop.")
@click.option("--replace", is_flag=True, help="Release an incompatible or broken reservation and make a new one.")
@click.option("--no-wait", is_flag=True, help="Submit and return; a later command waits for the hosts.")
@click.option("--dryrun", "--dry-run", is_flag=True, help="Print what would be submitted and exit.")
@click.option("--timeout", type=float, help="Give up waiting for hosts after this many seconds.")
@click.option("--workspace", metavar="PATH", help="Mount this folder read-only on every host (synced; "
                                                  "`monarch run` pushes changes first, `monarch sync --watch` on every save).")
@click.option("--env-dir", metavar="PATH", help="With --workspace: a Python environment (e.g. .venv) synced beside it.")
@click.option("--unreadable", type=click.Choice(["skip", "fail"]), default="skip", show_default=True,
              help="With --workspace: files that cannot be read are skipped and listed, or fail the sync.")
@click.pass_context
def serve(ctx: click.Context, hosts: int, procs_per_host: int, scheduler: str, name: str, partition: str | None,
          time_limit: str | None, account: str | None, qos: str | None, gpus_per_node: int | None,
          constraint: str | None, exclusive: bool, sbatch_arg: tuple[str, ...], client_host: str | None,
          bind: str | None, netns: bool, image: str | None, namespace: str | None, kubeconfig: str | None,
          kube_context: str | None, gpus_per_host: int | None, cpu: str | None, memory: str | None,
          node_selector: tuple[str, ...], toleration: tuple[str, ...], service_account: str | None,
          pod_template: str | None, attach: str | None, reach: str | None, output: str | None, replace: bool, no_wait: bool, dryrun: bool, timeout: float | None,
          workspace: str | None, env_dir: str | None, unreadable: str) -> None:
    """Reserve hosts and start a monarch agent on each; reuses a live reservation of the same shape."""
    from monarch._workbench.reserve import reserve
    from monarch._workbench.state import JobSpec, StatePaths
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
        if output and not dryrun:
            raise UsageError("-o/--output goes with --dry-run", "add --dry-run to review what would be created")
        kube = {"image": image, "namespace": namespace, "kubeconfig": kubeconfig, "context": kube_context,
                "gpus_per_host": gpus_per_host, "cpu": cpu, "memory": memory, "service_account": service_account,
                "attach": attach, "reach": reach}
        if scheduler == "kubernetes":
            from monarch_cli.commands._kube import kube_options

            options.update(kube_options(kube, node_selector, toleration, pod_template))
        elif any(v is not None for v in kube.values()) or node_selector or toleration or pod_template:
            raise UsageError(f"Kubernetes options given with --scheduler {scheduler}", "add --scheduler kubernetes")
        if bind:
            options["bind"] = bind
        if netns:
            if scheduler != "local":
                raise UsageError(f"--netns is for the local scheduler, not {scheduler}", "drop --netns")
            if bind:
                raise UsageError("--netns gives each host its own address; --bind cannot choose one", "drop --bind")
            options["netns"] = True
        spec = JobSpec(scheduler, hosts, procs_per_host, options)
        paths = StatePaths()
        if env_dir and not workspace:
            raise UsageError("--env-dir goes with --workspace", "add --workspace .")
        if workspace:
            from monarch._workbench.workspace import check_source

            # Before reserving anything: a bad path costs no allocation.
            check_source(workspace)
            if env_dir:
                check_source(env_dir, "environment folder")
        if dryrun:
            from monarch._workbench.reserve import scheduler_for

            req = scheduler_for(spec).dryrun(spec, paths.job_dir(name))
            if o.json:
                print_json({"scheduler": req.scheduler, "hosts": req.hosts, "request": req.text})
            else:
                # Plain stdout: the script must be copy-pasteable, not wrapped to the terminal.
                sys.stdout.write(req.text.rstrip("\n") + "\n")
            return
        started = time.monotonic()
        with err.status(f"reserving {spec.summary()} …") as st:
            lines = _ProgressLines(started) if not err.is_terminal and not o.json else None

            def progress(phase: str, ready: int, wanted: int, d) -> None:
                if phase == "pending" and d is not None:
                    text = f"waiting in queue (job {d.job_id}, {d.native_state}{': ' + d.reason if d.reason else ''})"
                elif phase in ("starting", "ready"):
                    text = f"host agents ready {ready}/{wanted}"
                else:
                    return
                if lines is not None:
                    lines.show(text, final=phase == "ready")
                elif phase != "ready":
                    st.update(text + " …")
            r = reserve(spec, name=name, paths=paths, wait=not no_wait, replace=replace, progress=progress, timeout=timeout)
        previous = paths.current()
        if previous == name or not os.path.exists(paths.state_file(previous)):
            previous = None  # nothing else was current: nothing changes for commands without --name
        paths.set_current(name)
        rec = r.record
        synced = None
        if workspace:
            from monarch._workbench.workspace import ReservationSync, describe, set_workspace

            set_workspace(rec, r.path, source=workspace, env_dir=env_dir or "", unreadable=unreadable)
            if rec.ready:
                with err.status("syncing the workspace to every host …"):
                    results = ReservationSync(rec).sync()
                synced = describe(results, len(rec.hosts))
                mounts = {m["host"]: m["mountpoint"] for m in results[0].mounts}
        data = {
            "name": rec.name, "job_id": rec.job_id, "scheduler": rec.spec.scheduler, "reused": r.reused,
            "ready": rec.ready, "state_file": r.path, "seconds": round(time.monotonic() - started, 3),
            "hosts": [{"host": h.host, "rank": h.host_rank, "addr": h.addr, "pid": h.pid} for h in rec.hosts],
        }
        if synced is not None:
            data["workspace"] = {"source": rec.workspace["source"], "synced": synced, "mounts": mounts}
            for h in data["hosts"]:
                h["workspace"] = mounts.get(h["host"], "")
        data["current"] = True
        if previous:
            data["previous_current"] = previous
        if o.json:
            print_json(data)
            return
        verb = "reused" if r.reused else ("submitted" if not rec.ready else "ready")
        names = [h.host for h in sorted(rec.hosts, key=lambda h: h.host_rank)]
        # A long reservation is named by its ends (`monarch status` lists every host).
        where = ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:3])}, …, {names[-1]}"
        err.print(f"job [bold]{rec.name!r}[/] {verb}: {rec.spec.summary()}, job {rec.job_id}"
                  + (f": {where}" if where else "") + f"  state: {_rel(r.path)}")
        if not rec.ready:
            err.print("  hosts are still starting; `monarch status` shows progress, and `monarch run` waits for them")
        if previous:
            # Commands without --name now act on this one: say so, and how to go back.
            err.print(f"  {rec.name!r} is now the current reservation (was {previous!r}); "
                      f"`monarch context use {previous}` switches back")
        if synced is not None:
            err.print(f"  {escape(synced)}")
            err.print(f"  workspace mounted read-only on every host (e.g. {escape(next(iter(mounts.values()), ''))})")


class _ProgressLines:
    """Progress as plain lines on a stderr that is no terminal (a CI log, a pipe): a line when it
    changed, at most one a second (and the last one), instead of a spinner nobody sees."""

    _EVERY_S = 1.0

    def __init__(self, started: float):
        self.started = started
        self.last_text = ""
        self.last_at = 0.0

    def show(self, text: str, final: bool = False) -> None:
        now = time.monotonic()
        if text == self.last_text or (not final and now - self.last_at < self._EVERY_S):
            return
        if final and not self.last_text:
            return  # ready at the first look: the summary line says it
        self.last_text, self.last_at = text, now
        err.print(f"{text} ({now - self.started:.1f} s)")


def _rel(path: str) -> str:
    import os

    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path
