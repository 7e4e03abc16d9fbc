"""``monarch stop``: release the reservation; every agent and proc goes away."""

from __future__ import annotations

import os

import click

from monarch.errors import StateError
from monarch_cli.commands._common import name_option, handled, opts
from monarch_cli.output import err, escape, print_json


@click.command("stop")
@name_option
@click.option("--force", is_flag=True,
              help="Also when the state file is unreadable: stop the agents its job folder names, remove the file.")
@click.option("--save", "save_dir", metavar="DIR", envvar="MONARCH_TELEMETRY_SAVE",
              help="First write every host's telemetry as Parquet under DIR (query it later with `monarch query --from DIR`).")
@click.pass_context
def stop(ctx: click.Context, name: str | None, force: bool, save_dir: str | None) -> None:
    """Release the reserved hosts and remove the state file (safe to repeat)."""
    from monarch._workbench.reserve import release, release_without_state
    from monarch._workbench.state import StatePaths, context_of, load_state, missing_state, remove_state
    o = opts(ctx)
    with handled(ctx):
        paths = StatePaths()
        path = paths.resolve(name)
        if not os.path.exists(path):
            gone = missing_state(path)
            if o.json:
                print_json({"stopped": False, "reason": gone.message, "hint": gone.hint})
            else:
                err.print(f"nothing to stop: {gone.message}")
                if "context use" in gone.hint:
                    err.print(f"  [dim]hint:[/] {escape(gone.hint)}")
            return
        try:
            record = load_state(path)
        except StateError:
            if not force:
                raise
            # The file is no use, but what it reserved may still run: its job folder says what.
            job_dir = paths.job_dir(context_of(path)) if os.path.dirname(path) == paths.root else ""
            done = release_without_state(job_dir) if job_dir else []
            remove_state(path)
            if o.json:
                print_json({"stopped": bool(done), "removed": path, "actions": done})
            else:
                for line in done:
                    err.print(line)
                err.print(f"removed unreadable state file {path}" + ("" if done else " (nothing of it was running)"))
            return
        saved = None
        if save_dir:
            saved = _save(record, save_dir)
        with err.status(f"releasing {record.name!r} ({record.job_id}) …"):
            release(record, path)
        if o.json:
            print_json({"stopped": True, "name": record.name, "job_id": record.job_id,
                        **({"saved": saved} if saved is not None else {})})
        else:
            err.print(f"stopped job {record.name!r} ({record.job_id}); hosts released")


def _save(record, save_dir: str) -> dict:
    """Write the telemetry of every host that answers under ``save_dir`` before the hosts go."""
    from monarch._workbench.telemetry import save

    with err.status(f"saving telemetry to {save_dir} …"):
        files, errors = save(record, save_dir)
    for host, why in errors.items():
        err.print(f"[yellow]warning:[/] telemetry of {host} not saved: {why}")
    err.print(f"saved telemetry ({len(files)} files) to {save_dir}; `monarch query --from {save_dir} SQL` reads it")
    return {"dir": os.path.abspath(save_dir), "files": len(files), "missing_hosts": sorted(errors)}
