"""``monarch dashboard`` (alias ``monarch tui``): the reservation live in a Textual app, or in a browser."""

from __future__ import annotations

import shlex
import sys

import click

from monarch_cli.commands._common import handled, name_option


def _command(name: str) -> click.Command:
    @click.command(name)
    @name_option
    @click.option("--web", is_flag=True, help="Serve the same app to a browser (textual-serve) instead of this terminal.")
    @click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port of --web.")
    @click.option("--host", "bind", default="127.0.0.1", show_default=True,
                  help="Address --web listens on (0.0.0.0 exposes the dashboard, and its actions, to the network).")
    @click.pass_context
    def dashboard(ctx: click.Context, name: str | None, web: bool, port: int, bind: str) -> None:
        """Every host, proc, actor and rank of the reservation, live: runs, logs, SQL, stacks, debug sessions.

        Keys: 1-6 switch views, / filters the tree, s takes stacks, x stops a run, k kills a proc,
        o opens `monarch shell` on the selected host, Enter on a debug session attaches to it (a pdb
        pane), e jumps to the first error in the logs, q quits. When the reservation is replaced
        (`monarch stop`, then `monarch serve`), the dashboard starts again on the new one. `--web --port 8000` serves the same app on http://127.0.0.1:8000.
        """
        from monarch._workbench.state import StatePaths

        with handled(ctx):
            path = StatePaths().resolve(name)
            if web:
                _serve_web(path, bind, port)
                return
            if not sys.stdout.isatty() or not sys.stdin.isatty():
                from monarch.errors import UsageError

                raise UsageError("the dashboard needs a terminal", "run it in a terminal, or `monarch dashboard --web`")
            from monarch_cli.tui.app import REPLACED, run_dashboard

            if run_dashboard(name, path=path) == REPLACED:
                relaunch()

    return dashboard


def relaunch_argv() -> list[str]:
    """This very command line (interpreter, its options, `-m` or script, arguments), to start it again."""
    return [sys.executable, *sys.orig_argv[1:]]


def relaunch() -> None:
    """Start this command again in this process (same pid and terminal): a new client, for the new job's keys.

    Called once the Textual app has given the terminal back; the runtime of the old job (its
    threads and sockets) goes with the old program image.
    """
    import os

    from monarch_cli.output import err

    err.print("the reservation was replaced: starting the dashboard again on the new one")
    sys.stdout.flush()
    sys.stderr.flush()
    argv = relaunch_argv()
    os.execv(argv[0], argv)


def _serve_web(path: str, bind: str, port: int) -> None:
    import os

    from textual_serve.server import Server

    from monarch_cli.output import err

    # Each browser tab runs its own app process on the same state file.
    command = f"{shlex.quote(sys.executable)} -m monarch_cli.tui.web {shlex.quote(path)}"
    if bind not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"[yellow]warning:[/] the dashboard (which can stop runs) listens on {bind}:{port}, beyond this machine")
    err.print(f"monarch dashboard on http://{bind}:{port} (Ctrl-C stops)")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    Server(command, host=bind, port=port, title="monarch dashboard").serve()


dashboard = _command("dashboard")
#: Monarch's name for the same thing.
tui = _command("tui")
