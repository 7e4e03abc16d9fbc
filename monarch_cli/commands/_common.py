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


#: Options users reach for that a command spells differently: the closest guess names ours.
_SYNONYMS = {"--rank": "--hosts", "--ranks": "--hosts", "--host": "--hosts", "--node": "--hosts",
             "--nodes": "--hosts", "--cwd": "--workdir", "--dir": "--workdir", "--environ": "--env"}


class CommandCommand(click.Command):
    """A command whose trailing arguments are a command line (``monarch run -- CMD``, ``exec``).

    Click, told to pass unknown options through, would run a typo'd option (``--rnak 1``) as the
    command itself.  Before the command's first word (or a ``--``), every ``-x``/``--xy`` must be one
    of ours: an unknown one is a usage error (exit 2) that names the closest option.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value: dict[str, bool] = {}
        for p in self.get_params(ctx):
            if isinstance(p, click.Option):
                for o in [*p.opts, *p.secondary_opts]:
                    takes_value[o] = not (p.is_flag or p.count)
        i = 0
        while i < len(args):
            a = args[i]
            if a == "--" or not a.startswith("-") or a == "-":
                break
            name = a.split("=", 1)[0] if a.startswith("--") else a[:2]
            if name not in takes_value:
                raise click.NoSuchOption(name, message=_no_such_option(name, sorted(takes_value)), ctx=ctx)
            i += 2 if takes_value[name] and "=" not in a and not (len(a) > 2 and not a.startswith("--")) else 1
        return super().parse_args(ctx, args)


def _no_such_option(name: str, known: list[str]) -> str:
    import difflib

    longs = [k for k in known if k.startswith("--")]
    guess = difflib.get_close_matches(name, [*longs, *_SYNONYMS], 1, 0.7)
    hint = _SYNONYMS.get(guess[0], guess[0]) if guess else ""
    if hint not in known:
        hint = ""
    return (f"no such option: {name}" + (f" (did you mean {hint}?)" if hint else "")
            + "; put the command after `--` if it starts with a dash")
