"""``monarch kill [name]``: PyTorch Monarch's verb for releasing a context's job (our `monarch stop`)."""

from __future__ import annotations

import os

import click

from monarch_cli.commands._common import handled, opts
from monarch_cli.output import err, print_json


@click.command("kill")
@click.argument("name", required=False)
@click.pass_context
def kill(ctx: click.Context, name: str | None) -> None:
    """Kill the job of context NAME (default: the active context); its saved spec stays for `monarch apply`."""
    o = opts(ctx)
    with handled(ctx):
        from monarch._workbench.reserve import release
        from monarch._workbench.state import StatePaths, context_of, load_state

        paths = StatePaths()
        path = paths.resolve(name)
        label = name or context_of(path)
        if not os.path.exists(path):
            if o.json:
                print_json({"killed": False, "context": label})
            else:
                err.print(f"No job to kill in context '{label}'")
            return
        record = load_state(path)
        release(record, path)
        if o.json:
            print_json({"killed": True, "context": label, "job_id": record.job_id})
        else:
            print(f"Killed context '{label}'", flush=True)
