"""The ``monarch`` command: composes the subcommands in monarch_cli/commands/.

Built on Click directly: ``monarch run`` starts a Python process every time, and
Typer (Click plus type-hint parsing) adds ~50 ms of imports and command building
to each start, a third of the overhead budget of a run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import click

import monarch

# Command modules keep their machinery (ZeroMQ, Rich, the job code) in function-local
# imports: every `monarch run` pays for what this line imports.
from monarch_cli.commands import context, debug, logs, query, run, serve, shell, stack, status, stop, sync, version, why


@dataclass
class Options:
    verbose: bool = False
    json: bool = False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(monarch.__version__, "--version", "-V", prog_name="monarch", message="%(prog)s %(version)s")
@click.option("--verbose", "-v", is_flag=True, help="Show details and tracebacks on errors.")
@click.option("--json", "json_out", is_flag=True, help="Print machine-readable JSON on stdout.")
@click.pass_context
def app(ctx: click.Context, verbose: bool, json_out: bool) -> None:
    """Reserve hosts once, run many times: distributed PyTorch jobs on local, Slurm or Kubernetes hosts.

    `monarch serve` reserves hosts and starts an agent on each; `monarch run` runs on them, again and again.
    """
    ctx.obj = Options(verbose=verbose, json=json_out)
    if verbose:
        logging.basicConfig(level=os.environ.get("MONARCH_LOG", "INFO"))


for command in (serve.serve, run.run, sync.sync, status.status, logs.logs, shell.shell, stop.stop, version.version,
                context.app, query.query, why.why, stack.stack, debug.debug):
    app.add_command(command)


def main() -> None:
    app(prog_name="monarch")


if __name__ == "__main__":
    main()
