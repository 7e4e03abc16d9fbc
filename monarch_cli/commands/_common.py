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


class Duration(click.ParamType):
    """A duration as Monarch writes them (500ms, 30s, 2m, 1h), or plain seconds."""

    name = "DURATION"

    def convert(self, value, param, ctx) -> float:
        import re

        if isinstance(value, (int, float)):
            return float(value)
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", str(value))
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2) or "s"] if m else 0.0
        if seconds <= 0:
            self.fail(f"{value!r}: a duration is a positive number followed by ms, s, m or h (e.g. 30s, 2m)", param, ctx)
        return seconds
