"""``monarch run``: run a command on every reserved host, or an actor program against them.

Its options and help; the work is :func:`monarch_cli.commands.run_core.run_main`, which the lean
entry point (:mod:`monarch_cli.lean`) calls without Click for the everyday command lines.
"""

from __future__ import annotations

import click

from monarch_cli.commands._common import CommandCommand, name_option, handled, opts
from monarch_cli.commands.run_core import outcome_doc, run_main

__all__ = ["run", "outcome_doc"]


@click.command("run", cls=CommandCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                     "allow_interspersed_args": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@name_option
@click.option("--hosts", help="Only these host ranks, e.g. 0,2.")
@click.option("--env", "-e", multiple=True, help="K=V added to the environment (repeatable).")
@click.option("--workdir", "-w", help="Working directory on the hosts (default: this one).")
@click.option("--detach", "-d", is_flag=True, help="Start and return; read output with `monarch logs`.")
@click.option("--pdb", "post_mortem", is_flag=True,
              help="A rank that dies of an uncaught Python exception waits in a post-mortem pdb for `monarch debug`.")
@click.option("--warn-before", type=float, envvar="MONARCH_WARN_BEFORE", metavar="MINUTES",
              help="Warn when the reservation is this close to its time limit (Slurm; default 5).")
@click.pass_context
def run(ctx: click.Context, command: tuple[str, ...], name: str | None, hosts: str | None, env: tuple[str, ...],
        workdir: str | None, detach: bool, post_mortem: bool, warn_before: float | None) -> None:
    """Run CMD on the reserved hosts with torchrun's multi-node environment, streaming output."""
    o = opts(ctx)
    with handled(ctx):
        code = run_main(list(command or []) + list(ctx.args), name=name, hosts=hosts, env=env, workdir=workdir,
                        detach=detach, post_mortem=post_mortem, warn_before=warn_before, verbose=o.verbose,
                        as_json=o.json)
    raise click.exceptions.Exit(code)
