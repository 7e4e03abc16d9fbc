"""Helpers every command shares: options, and running a body under the error handler."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import click

from monarch_cli.errors import fail
from monarch_cli.options import Options

name_option = click.option("--name", "-n", help="Which reservation (context); default: the current one. MONARCH_JOB=path overrides.")


def opts(ctx: click.Context):
    """The global flags (--json, --verbose), wherever on the command line they were given."""
    o = ctx.find_object(Options)
    return o if o is not None else Options()


@contextmanager
def handled(ctx: click.Context) -> Iterator[None]:
    """Turn monarch errors (and Ctrl-C) into one line and an exit code."""
    try:
        yield
    except click.exceptions.Exit:
        raise
    except (Exception, KeyboardInterrupt) as e:
        o = opts(ctx)
        raise fail(e, o.verbose, o.json) from None
