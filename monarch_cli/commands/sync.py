"""``monarch sync``: push the workspace to every reserved host now, or on every change (``--watch``)."""

from __future__ import annotations

import os

import click

from monarch_cli.commands._common import handled, name_option, opts
from monarch_cli.output import err, escape

#: watchfiles yields once no new change came for this long (ms): an editor's save is one sync.
_WATCH_STEP_MS = 10
_WATCH_DEBOUNCE_MS = 100
_WATCH_IDLE_MS = 1000


@click.command("sync")
@name_option
@click.option("--watch", "-w", is_flag=True, help="Keep running: every change is pushed to every host.")
@click.option("--workspace", "source", metavar="PATH",
              help="Folder to sync from now on (default: the one `monarch serve --workspace` gave).")
@click.option("--env-dir", metavar="PATH", help="A Python environment synced beside it (e.g. .venv).")
@click.option("--unreadable", type=click.Choice(["skip", "fail"]),
              help="Files that cannot be read: skip and list them (default), or fail the sync.")
@click.pass_context
def sync(ctx: click.Context, name: str | None, watch: bool, source: str | None, env_dir: str | None,
         unreadable: str | None) -> None:
    """Push the workspace to every reserved host, where it is mounted read-only; only changes travel."""
    from monarch.errors import WorkspaceError
    from monarch_cli.commands.sync_core import sync_once
    o = opts(ctx)
    with handled(ctx):
        rs, record, results = sync_once(name, source=source, env_dir=env_dir, unreadable=unreadable)
        _report(o, results, len(record.hosts))
        if not watch:
            return
        import watchfiles

        roots = [p.source for p in rs.pushers]
        ready = False
        # yield_on_timeout: the first (empty) yield says the watcher runs; then an edit made since the
        # sync above is pushed, and "watching" is true when it is printed.
        # Ctrl-C while a sync runs (not inside the watcher, which swallows it) ends the watch as quietly.
        try:
            for changes in watchfiles.watch(*roots, watch_filter=_interesting, debounce=_WATCH_DEBOUNCE_MS,
                                            step=_WATCH_STEP_MS, raise_interrupt=False, yield_on_timeout=True,
                                            rust_timeout=_WATCH_IDLE_MS):
                if not changes and ready:
                    continue
                try:
                    results = rs.sync()
                except WorkspaceError as e:
                    err.print(f"[bold red]error:[/] {escape(e.message)}")
                    continue
                if any(r.changed for r in results):
                    _report(o, results, len(record.hosts))
                if not ready:
                    ready = True
                    err.print(f"watching {', '.join(escape(r) for r in roots)} (Ctrl-C stops)")
        except KeyboardInterrupt:
            return


def _interesting(change, path: str) -> bool:
    parts = path.split(os.sep)
    return ".git" not in parts and ".monarch" not in parts and "__pycache__" not in parts


def _report(o, results, hosts: int) -> None:
    from monarch_cli.commands.sync_core import report

    report(results, hosts, o.json)
