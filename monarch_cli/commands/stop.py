"""``monarch stop``: release the reservation; every agent and proc goes away."""

from __future__ import annotations

import os

import click

from monarch.errors import StateError
from monarch_cli.commands._common import name_option, handled, opts
from monarch_cli.output import err, print_json


@click.command("stop")
@name_option
@click.option("--force", is_flag=True, help="Remove a corrupt or unreadable state file too.")
@click.option("--save", "save_dir", metavar="DIR", envvar="MONARCH_TELEMETRY_SAVE",
              help="First write every host's telemetry as Parquet under DIR (query it later with `monarch query --from DIR`).")
@click.pass_context
def stop(ctx: click.Context, name: str | None, force: bool, save_dir: str | None) -> None:
    """Release the reserved hosts and remove the state file (safe to repeat)."""
    from monarch.job.reserve import release
    from monarch.job.state import StatePaths, load_state, remove_state
    o = opts(ctx)
    with handled(ctx):
        paths = StatePaths()
        path = paths.resolve(name)
        if not os.path.exists(path):
            if o.json:
                print_json({"stopped": False, "reason": "no reservation"})
            else:
                err.print("nothing to stop: no reservation here")
            return
        try:
            record = load_state(path)
        except StateError:
            if not force:
                raise
            remove_state(path)
            err.print(f"removed unreadable state file {path}")
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
    from monarch.job.telemetry import save

    with err.status(f"saving telemetry to {save_dir} …"):
        files, errors = save(record, save_dir)
    for host, why in errors.items():
        err.print(f"[yellow]warning:[/] telemetry of {host} not saved: {why}")
    err.print(f"saved telemetry ({len(files)} files) to {save_dir}; `monarch query --from {save_dir} SQL` reads it")
    return {"dir": os.path.abspath(save_dir), "files": len(files), "missing_hosts": sorted(errors)}
