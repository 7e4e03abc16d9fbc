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
        (`monarch stop`, then `monarch serve`), the dashboard starts again on the new one. `--web --port 8000` serves the same app on http://127.0.0.1:8000 to a browser that opens the address it prints (with its token).
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
    import secrets

    from monarch_cli.output import err

    # Each browser tab runs its own app process on the same state file.
    command = f"{shlex.quote(sys.executable)} -m monarch_cli.tui.web {shlex.quote(path)}"
    if bind not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"[yellow]warning:[/] the dashboard (which can stop runs) listens on {bind}:{port}, beyond this machine")
    # Loopback is no fence on a shared machine: every local user reaches it, and the app behind it
    # reads your logs, stops runs and opens shells as you.  So only a browser that opened the
    # address with this token (printed here, to your terminal only) gets in.
    token = secrets.token_urlsafe(24)
    shown = f"[{bind}]" if ":" in bind else bind
    sys.stderr.write(f"monarch dashboard on http://{shown}:{port}/?token={token} (Ctrl-C stops)\n")
    sys.stderr.flush()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    _token_server(command, bind, port, token).serve()


def _token_server(command: str, bind: str, port: int, token: str):  # noqa: ANN202 - textual_serve is imported late
    """textual-serve's server, admitting only requests that carry ``token``: as ``?token=`` (the
    address printed at start; the answer sets a cookie, SameSite=Strict, HttpOnly) or that cookie
    (the page's websocket and static files, from a page of the same origin)."""
    import hmac

    from aiohttp import web
    from textual_serve.server import Server

    cookie = f"monarch_dashboard_{port}"  # cookies are per host, not per port: one per dashboard

    @web.middleware
    async def admit(request: web.Request, handler):  # noqa: ANN001, ANN202 - aiohttp's middleware shape
        if hmac.compare_digest(request.query.get("token", ""), token):
            response = await handler(request)
            response.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
            return response
        if hmac.compare_digest(request.cookies.get(cookie, ""), token):
            origin = request.headers.get("Origin")
            if origin is None or origin.split("://", 1)[-1] == request.host:
                return await handler(request)
        raise web.HTTPForbidden(text="monarch dashboard: open the address `monarch dashboard --web` printed "
                                     "(it carries the token)\n")

    class TokenServer(Server):
        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            app.middlewares.append(admit)
            return app

    return TokenServer(command, host=bind, port=port, title="monarch dashboard")


dashboard = _command("dashboard")
#: Monarch's name for the same thing.
tui = _command("tui")
