"""``monarch debug``: the ``monarch_dbg>`` prompt over every rank paused in ``breakpoint()``."""

from __future__ import annotations

import click

from monarch_cli.commands._common import handled, name_option, opts


@click.group("debug", invoke_without_command=True)
@name_option
@click.pass_context
def debug(ctx: click.Context, name: str | None) -> None:
    """Attach to ranks paused in breakpoint() or pdb.set_trace() (and `monarch run --pdb` failures).

    Opens the monarch_dbg> prompt: list, attach <id>, cast ranks(...) <pdb command>, continue,
    quit, help.  Reads commands from standard input when it is not a terminal, so
    `printf 'list\\nquit\\n' | monarch debug` works in scripts.
    """
    ctx.ensure_object(type(opts(ctx)))
    if ctx.invoked_subcommand is not None:
        return
    from monarch_cli.debug_repl import DebugPrompt
    from monarch._workbench.debug import DebugClient
    from monarch._workbench.reserve import load_live

    with handled(ctx):
        record, _ = load_live(name, progress=lambda *a: None)
        DebugPrompt(DebugClient(record)).loop()


@debug.command("list")
@name_option
@click.option("--json", "json_out", is_flag=True, help="Print the sessions as JSON on stdout.")
@click.pass_context
def list_cmd(ctx: click.Context, name: str | None, json_out: bool) -> None:
    """List the job's debug sessions (id, rank, host, what and where it stopped)."""
    from monarch_cli.debug_repl import session_table
    from monarch_cli.output import err, print_json
    from monarch._workbench.debug import DebugClient
    from monarch._workbench.reserve import load_live

    o = opts(ctx)
    name = name or (ctx.parent.params.get("name") if ctx.parent else None)
    with handled(ctx):
        record, _ = load_live(name, progress=lambda *a: None)
        client = DebugClient(record)
        sessions = client.refresh()
        for bad in client.unreachable:
            err.print(f"[yellow]warning:[/] host agent {bad} did not answer")
        if json_out or o.json:
            print_json([s.to_dict() for s in sessions])
        else:
            click.echo(session_table(sessions), nl=False)
