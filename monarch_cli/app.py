"""The ``monarch`` command's Click app: a lazy group over the subcommands in monarch_cli/commands/.

Built on Click directly, not Typer: ``monarch run`` starts a Python process every time, and
Typer's imports and per-start command building cost ~50 ms of each.  A subcommand's module is
imported only when that subcommand runs (or when help lists it), and Rich only when there is
something to draw: ``monarch run`` pays for neither the other commands nor the help.
"""

from __future__ import annotations

import logging
import os

import click

import monarch
from monarch.errors import ExitCode
from monarch_cli.help import QUICK_START, RichContext
from monarch_cli.options import Options

#: name -> "module:attribute", in the order help lists them.
COMMANDS = {
    "serve": "monarch_cli.commands.serve:serve",
    "run": "monarch_cli.commands.run:run",
    "sync": "monarch_cli.commands.sync:sync",
    "status": "monarch_cli.commands.status:status",
    "logs": "monarch_cli.commands.logs:logs",
    "shell": "monarch_cli.commands.shell:shell",
    "stop": "monarch_cli.commands.stop:stop",
    "context": "monarch_cli.commands.context:app",
    "version": "monarch_cli.commands.version:version",
    "query": "monarch_cli.commands.query:query",
    "why": "monarch_cli.commands.why:why",
    "stack": "monarch_cli.commands.stack:stack",
    "debug": "monarch_cli.commands.debug:debug",
    "dashboard": "monarch_cli.commands.dashboard:dashboard",
    "tui": "monarch_cli.commands.dashboard:tui",
    # PyTorch Monarch's own verbs (its agent guide teaches them), on the same machinery.
    "apply": "monarch_cli.commands.apply:apply",
    "exec": "monarch_cli.commands.exec_:exec_",
    "kill": "monarch_cli.commands.kill:kill",
    "profile": "monarch_cli.commands.profile:profile",
    "guide": "monarch_cli.commands.guide:guide",
}


def _global_flag(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    o = ctx.find_object(Options)
    if o is None:
        return
    setattr(o, param.name, True)
    if param.name == "verbose":
        logging.basicConfig(level=os.environ.get("MONARCH_LOG", "INFO"))


def _global_params() -> list[click.Option]:
    return [
        click.Option(["--verbose", "-v"], is_flag=True, expose_value=False, callback=_global_flag,
                     help="Show details and tracebacks on errors."),
        click.Option(["--json"], "json", is_flag=True, expose_value=False, callback=_global_flag,
                     help="Print one JSON document on stdout (errors too)."),
    ]


def _also_global_json(own):
    def callback(ctx: click.Context, param: click.Parameter, value):
        if value and not ctx.resilient_parsing and ctx.find_object(Options) is not None:
            ctx.find_object(Options).json = True
        return own(ctx, param, value) if own is not None else value

    callback._sets_global_json = True
    return callback


def _adopt(cmd: click.Command) -> click.Command:
    """Give a loaded command (and a group's subcommands) the global flags and the Rich help."""
    cmd.context_class = RichContext
    names = {n for p in cmd.params for n in getattr(p, "opts", [])}
    cmd.params.extend(p for p in _global_params() if not names & set(p.opts))
    for p in cmd.params:
        # A command's own --json (query, why, stack, debug list) is also the global one: an error
        # raised under it must be the JSON document on stdout too.
        if "--json" in getattr(p, "opts", []) and p.callback is not _global_flag and \
                not getattr(p.callback, "_sets_global_json", False):
            p.callback = _also_global_json(p.callback)
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _adopt(sub)
    return cmd


class LazyGroup(click.Group):
    """Click's lazy group: a subcommand's module is imported when it is asked for."""

    context_class = RichContext

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Name exactly the schedulers there are (help must not promise one `serve` refuses).
        from monarch._workbench.reserve import scheduler_names as names

        labels = {"local": "this machine", "slurm": "Slurm", "kubernetes": "Kubernetes"}
        where = [labels.get(n, n) for n in sorted(names(), key=lambda n: n != "local")]
        text = ", ".join(where[:-1]) + f" or {where[-1]}" if len(where) > 1 else where[0]
        old, self.help = self.help, (self.help or "").replace("{schedulers}", text)
        try:
            super().format_help_text(ctx, formatter)
        finally:
            self.help = old

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Each command's whole first sentence: Rich wraps it to the terminal (Click would cut it
        # to fit 80 columns with "...", even on a wide one).
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        import importlib

        module, attr = target.split(":")
        return _adopt(getattr(importlib.import_module(module), attr))


def _exit_code_epilog() -> str:
    rows = "\n".join(f"  {int(c):>3}  {c.meaning}" for c in ExitCode)
    return f"\b\nExit codes:\n{rows}\n\n{QUICK_START}"


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_exit_code_epilog())
@click.version_option(monarch.__version__, "--version", "-V", prog_name="monarch", message="%(prog)s %(version)s")
@click.option("--verbose", "-v", is_flag=True, expose_value=False, callback=_global_flag,
              help="Show details and tracebacks on errors.")
@click.option("--json", "json", is_flag=True, expose_value=False, callback=_global_flag,
              help="Print one JSON document on stdout (errors too).")
def app() -> None:
    """Reserve hosts once, run many times: distributed PyTorch jobs on {schedulers} hosts.

    `monarch serve` reserves hosts and starts an agent on each; `monarch run` runs on them, again and
    again. --json and --verbose go before or after the subcommand.
    """


def _json_requested(argv: list[str]) -> bool:
    """--json among monarch's own arguments (not after `--`, where the run's command begins)."""
    own = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in own


def run_app(argv: list[str]) -> int:
    """The whole command line through Click: every way out goes through one exit-code table."""
    try:
        code = app.main(args=argv, prog_name="monarch", standalone_mode=False, obj=Options())
    except click.ClickException as e:  # usage errors Click found before any command ran
        from monarch_cli.errors import report_click_error

        code = report_click_error(e, as_json=_json_requested(argv))
    except (click.exceptions.Abort, KeyboardInterrupt):
        from monarch_cli.errors import fail

        code = fail(KeyboardInterrupt(), as_json=_json_requested(argv)).exit_code
    return code if isinstance(code, int) else ExitCode.OK
