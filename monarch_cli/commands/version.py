"""``monarch version``."""

from __future__ import annotations

import platform

import click

import monarch
from monarch_cli.commands._common import opts
from monarch_cli.output import out, print_json


@click.command("version")
@click.pass_context
def version(ctx: click.Context) -> None:
    """Print monarch's version."""
    import zmq

    data = {"monarch": monarch.__version__, "python": platform.python_version(), "pyzmq": zmq.__version__}
    if opts(ctx).json:
        print_json(data)
    else:
        out.print(f"monarch {monarch.__version__} (python {data['python']}, pyzmq {data['pyzmq']})")
