"""``monarch shell``: an interactive shell, on a real pty, on one reserved host."""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import termios
import tty

import click

from monarch.errors import AgentError, UsageError
from monarch_cli.commands._common import name_option, handled


@click.command("shell", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                     "allow_interspersed_args": False})
@click.option("--host", type=int, default=0, show_default=True, help="Host rank to open the shell on.")
@name_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def shell(ctx: click.Context, host: int, name: str | None, command: tuple[str, ...]) -> None:
    """Open an interactive shell on a reserved host (exit the shell to come back)."""
    from monarch._workbench.reserve import load_live
    from monarch._workbench.shell import RemoteShell
    with handled(ctx):
        record, _ = load_live(name)
        by_rank = {h.host_rank: h for h in record.hosts}
        if host not in by_rank:
            raise UsageError(f"no host rank {host} in this reservation (it has 0..{len(record.hosts) - 1})")
        target = by_rank[host]
        rows, cols = _size()
        argv = list(command or []) or [os.environ.get("SHELL", "/bin/bash"), "-i"]
        env = {"TERM": os.environ.get("TERM", "xterm"), "MONARCH_HOST_RANK": str(target.host_rank)}
        sh = RemoteShell(record, target, argv, env=env, cwd=os.getcwd(), rows=rows, cols=cols,
                         on_output=lambda data: os.write(sys.stdout.fileno(), data))
        sh.start()
        stdin = sys.stdin.fileno()
        is_tty = os.isatty(stdin)
        saved = termios.tcgetattr(stdin) if is_tty else None
        old_winch = signal.signal(signal.SIGWINCH, lambda *_: sh.resize(*_size()))
        try:
            if is_tty:
                tty.setraw(stdin)
            while not sh.done.is_set():
                ready, _, _ = select.select([stdin], [], [], 0.1)
                if ready:
                    data = os.read(stdin, 4096)
                    if not data:
                        # stdin closed: send EOF (Ctrl-D) and let the shell finish.
                        sh.send(b"\x04")
                        sh.wait(5)
                        break
                    sh.send(data)
        finally:
            if saved is not None:
                termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
            signal.signal(signal.SIGWINCH, old_winch)
        if getattr(sh, "agent_lost", False):
            # One exit-code table: a lost agent is 5 here as for `monarch run`, not 255.
            raise AgentError(sh.reason, "`monarch status` shows which agents answer")
        raise click.exceptions.Exit(sh.exit_code if sh.exit_code is not None else 0)


def _size() -> tuple[int, int]:
    s = shutil.get_terminal_size((80, 24))
    return s.lines, s.columns
