"""``monarch context ls|use``: named reservations in this directory."""

from __future__ import annotations

import os

import click

from monarch.errors import StateError
from monarch_cli.commands._common import handled, opts
from monarch_cli.output import err, out, print_json

@click.group("context")
def app() -> None:
    """List or switch between named reservations (contexts)."""


@app.command("ls")
@click.pass_context
def ls(ctx: click.Context) -> None:
    """List the reservations in this directory; * marks the current one."""
    from rich.table import Table
    from monarch.job.state import StatePaths, load_state
    with handled(ctx):
        paths = StatePaths()
        cur = paths.current()
        rows = []
        for n in paths.contexts():
            try:
                r = load_state(paths.state_file(n))
                rows.append({"name": n, "current": n == cur, "job_id": r.job_id, "shape": r.spec.summary()})
            except StateError as e:
                rows.append({"name": n, "current": n == cur, "job_id": "", "shape": f"unreadable: {e.message}"})
        if opts(ctx).json:
            print_json(rows)
            return
        t = Table("", "name", "job", "shape")
        for r in rows:
            t.add_row("*" if r["current"] else "", r["name"], r["job_id"], r["shape"])
        out.print(t)


@app.command("use")
@click.argument("name")
@click.pass_context
def use(ctx: click.Context, name: str) -> None:
    """Make NAME the reservation later commands use."""
    from monarch.job.state import StatePaths
    with handled(ctx):
        paths = StatePaths()
        if not os.path.exists(paths.state_file(name)):
            raise StateError(f"no reservation named {name!r}", f"`monarch serve --name {name}` creates it")
        paths.set_current(name)
        err.print(f"now using {name!r}")
