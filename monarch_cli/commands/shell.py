"""``monarch shell``: an interactive shell, on a real pty, on one reserved host."""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import termios
import threading
import tty
import uuid

import click

from monarch.errors import UsageError
from monarch_cli.commands._common import name_option, handled


@click.command("shell", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@click.option("--host", type=int, default=0, show_default=True, help="Host rank to open the shell on.")
@name_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def shell(ctx: click.Context, host: int, name: str | None, command: tuple[str, ...]) -> None:
    """Open an interactive shell on a reserved host (exit the shell to come back)."""
    from monarch_agents import messages as m
    from monarch_agents.client import ensure_runtime
    from monarch.job.reserve import load_live
    with handled(ctx):
        record, _ = load_live(name)
        by_rank = {h.host_rank: h for h in record.hosts}
        if host not in by_rank:
            raise UsageError(f"no host rank {host} in this reservation (it has 0..{len(record.hosts) - 1})")
        target = by_rank[host]
        rt = ensure_runtime(record.keys)
        shell_id = uuid.uuid4().hex
        done = threading.Event()
        result = {"code": 0}

        def on_data(msg: m.ShellData) -> None:
            if msg.shell_id == shell_id and msg.data:
                os.write(sys.stdout.fileno(), msg.data)

        def on_exit(msg: m.RunExited) -> None:
            if msg.run_id == shell_id:
                result["code"] = msg.exit_code
                done.set()

        rt.register(m.ShellData, on_data)
        rt.register(m.RunExited, on_exit)
        rt.watch(target.addr, lambda err: (result.update(code=255), done.set()))
        rows, cols = _size()
        argv = list(command or []) or [os.environ.get("SHELL", "/bin/bash"), "-i"]
        env = {"TERM": os.environ.get("TERM", "xterm"), "MONARCH_HOST_RANK": str(target.host_rank)}
        rt.send(target.addr, m.OpenShell(shell_id, argv, env, os.getcwd(), rows, cols, m.PortRef(rt.addr, 0), rt.addr))
        stdin = sys.stdin.fileno()
        is_tty = os.isatty(stdin)
        saved = termios.tcgetattr(stdin) if is_tty else None
        old_winch = signal.signal(signal.SIGWINCH, lambda *_: rt.send(target.addr, m.ShellData(shell_id, b"", *_size())))
        try:
            if is_tty:
                tty.setraw(stdin)
            while not done.is_set():
                ready, _, _ = select.select([stdin], [], [], 0.1)
                if ready:
                    data = os.read(stdin, 4096)
                    if not data:
                        # stdin closed: send EOF (Ctrl-D) and let the shell finish.
                        rt.send(target.addr, m.ShellData(shell_id, b"\x04"))
                        done.wait(5)
                        break
                    rt.send(target.addr, m.ShellData(shell_id, data))
        finally:
            if saved is not None:
                termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
            signal.signal(signal.SIGWINCH, old_winch)
        raise click.exceptions.Exit(result["code"])


def _size() -> tuple[int, int]:
    s = shutil.get_terminal_size((80, 24))
    return s.lines, s.columns
