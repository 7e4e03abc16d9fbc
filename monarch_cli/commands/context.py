"""``monarch context create|use|rm|ls``: named reservations (contexts) in this directory, with Monarch's messages."""

from __future__ import annotations

import os

import click

from monarch.errors import StateError
from monarch_cli.commands._common import handled, opts
from monarch_cli.output import out, print_json

@click.group("context")
def app() -> None:
    """List or switch between named reservations (contexts)."""


@app.command("ls")
@click.pass_context
def ls(ctx: click.Context) -> None:
    """List the reservations in this directory; * marks the current one."""
    from rich.table import Table
    from monarch._workbench.state import StatePaths, load_state
    with handled(ctx):
        paths = StatePaths()
        cur = paths.current()
        rows = []
        with_state = set(paths.contexts())
        # The current context is listed once chosen (`context use`), reserved or not; else "No contexts."
        chosen = {cur} if os.path.exists(paths.current_file) else set()
        for n in sorted(with_state | set(known_contexts(paths)) | chosen):
            if n not in with_state:
                rows.append({"name": n, "current": n == cur, "job_id": "", "shape": "no job (`monarch apply` or `monarch serve`)"})
                continue
            try:
                r = load_state(paths.state_file(n))
                rows.append({"name": n, "current": n == cur, "job_id": r.job_id, "shape": r.spec.summary()})
            except StateError as e:
                rows.append({"name": n, "current": n == cur, "job_id": "", "shape": f"unreadable: {e.message}"})
        if opts(ctx).json:
            print_json(rows)
            return
        if not rows:
            print("No contexts.")
            return
        t = Table("", "name", "job", "shape")
        for r in rows:
            t.add_row("*" if r["current"] else "", r["name"], r["job_id"], r["shape"])
        out.print(t)


@app.command("use")
@click.argument("name")
@click.pass_context
def use(ctx: click.Context, name: str) -> None:
    """Make NAME the context later commands use (created if new: `monarch apply` or `monarch serve` fills it)."""
    from monarch._workbench.state import StatePaths
    with handled(ctx):
        paths = StatePaths()
        paths.check_name(name)
        if not os.path.exists(paths.state_file(name)):
            _mark(paths, name)
        paths.set_current(name)
        _say(ctx, f"Switched to context '{name}'", context=name, current=True)


@app.command("create")
@click.argument("name")
@click.pass_context
def create(ctx: click.Context, name: str) -> None:
    """Create the context NAME (without switching to it)."""
    from monarch._workbench.state import StatePaths
    with handled(ctx):
        paths = StatePaths()
        paths.check_name(name)
        _mark(paths, name)
        _say(ctx, f"Created context '{name}'", context=name, created=True)


@app.command("rm")
@click.argument("name")
@click.pass_context
def rm(ctx: click.Context, name: str) -> None:
    """Remove the context NAME, releasing its job if it has one; the default context becomes current if it was."""
    from monarch._workbench.reserve import release
    from monarch._workbench.state import DEFAULT_CONTEXT, StatePaths, load_state, remove_state
    with handled(ctx):
        paths = StatePaths()
        path = paths.state_file(name)
        if os.path.exists(path):
            try:
                release(load_state(path), path)
            except StateError:
                remove_state(path)
        for f in (_marker(paths, name), os.path.join(paths.root, "specs", name)):
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass
        if paths.current() == name:
            paths.set_current(DEFAULT_CONTEXT)
        _say(ctx, f"Removed context '{name}'", context=name, removed=True)


def _marker(paths, name: str) -> str:
    return os.path.join(paths.root, "contexts", name)


def _mark(paths, name: str) -> None:
    from monarch._workbench.state import private

    private(os.path.join(paths.root, "contexts"), top=paths.root)
    with open(_marker(paths, name), "a"):
        pass


def known_contexts(paths) -> list[str]:
    """Contexts made by `context create|use` or holding a `monarch apply` spec, reserved or not."""
    names: set[str] = set()
    for sub in ("contexts", "specs"):
        try:
            names.update(os.listdir(os.path.join(paths.root, sub)))
        except FileNotFoundError:
            pass
    return sorted(names)


def _say(ctx: click.Context, line: str, **doc) -> None:
    if opts(ctx).json:
        print_json(doc)
    else:
        print(line, flush=True)
