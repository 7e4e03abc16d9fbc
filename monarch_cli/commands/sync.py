"""``monarch sync``: push the workspace to every reserved host now, or on every change (``--watch``)."""

from __future__ import annotations

import os
import sys

import click

from monarch_cli.commands._common import handled, name_option, opts
from monarch_cli.output import err, escape, print_json

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
    from monarch.errors import UsageError, WorkspaceError
    from monarch._workbench.reserve import load_live
    from monarch._workbench.workspace import ReservationSync, set_workspace
    o = opts(ctx)
    with handled(ctx):
        record, path = load_live(name)
        if source or env_dir or unreadable:
            current = record.workspace or {}
            set_workspace(record, path, source=source or current.get("source") or os.getcwd(),
                          env_dir=env_dir if env_dir is not None else current.get("env_dir", ""),
                          unreadable=unreadable or current.get("unreadable", "skip"))
        if not record.workspace:
            raise UsageError("this reservation has no workspace to sync",
                             "`monarch sync --workspace .` (or `monarch serve --workspace .`)")
        rs = ReservationSync(record)
        results = rs.sync()
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
    from monarch._workbench.workspace import describe

    if o.json:
        print_json([{"generation": r.generation, "files": r.files, "bytes": r.bytes, "sent_chunks": r.sent_chunks,
                     "sent_bytes": r.sent_bytes, "seconds": round(r.seconds, 4), "changed": r.changed,
                     "skipped": [{"path": p, "why": w} for p, w in r.skipped], "transport": r.transport,
                     "transport_reason": r.transport_reason,
                     "mounts": [{"host": m.get("host", ""), "mountpoint": m["mountpoint"], "mode": m["mode"]}
                                for m in r.mounts]} for r in results])
    else:
        # Plain text, no markup: written as it is, without importing Rich (~50 ms of every sync).
        sys.stderr.write(describe(results, hosts) + "\n")
        sys.stderr.flush()
