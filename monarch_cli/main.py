"""The ``monarch`` command: composes the subcommands in monarch_cli/commands/."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Annotated

import typer

# Command modules keep their machinery (ZeroMQ, Rich, the job code) in function-local
# imports: every `monarch run` pays for what this line imports, and that budget is ~50 ms.
from monarch_cli.commands import context, logs, run, serve, shell, status, stop, version

app = typer.Typer(
    name="monarch",
    help="Reserve hosts once, run many times: distributed PyTorch jobs on local, Slurm or Kubernetes hosts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@dataclass
class Options:
    verbose: bool = False
    json: bool = False


@app.callback()
def main_callback(
    ctx: typer.Context,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show details and tracebacks on errors.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """monarch: reserve once (`monarch serve`), run many times (`monarch run`)."""
    ctx.obj = Options(verbose=verbose, json=json_out)
    if verbose:
        logging.basicConfig(level=os.environ.get("MONARCH_LOG", "INFO"))


app.command("serve")(serve.serve)
app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run.run)
app.command("status")(status.status)
app.command("logs")(logs.logs)
app.command("shell")(shell.shell)
app.command("stop")(stop.stop)
app.command("version")(version.version)
app.add_typer(context.app, name="context")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
