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

import click

from monarch.errors import AgentError, UsageError
from monarch_cli.commands._common import name_option, handled, opts
from monarch_cli.output import print_json

#: stdin is not a terminal (`echo cmd | monarch shell`): as ssh without a tty, only the commands'
#: output comes back: no echo of what was typed, no \r before \n, and no interactive shell (its
#: prompt and bracketed-paste escapes are for a terminal). The pty stays: its Ctrl-D ends input.
#: Input waits for _READY, printed once echo is off (the pty would echo what arrived before).
#: The command is sh's child, not exec'd: as the pty's session leader, a command reading to EOF
#: was sometimes reported killed by SIGHUP (2-5 of 20 `monarch shell -- cat` here, before too).
_READY = b"\x1emonarch-shell-ready\x1e"
_PIPED_SHELL = 'stty -echo -onlcr 2>/dev/null; printf "\\036monarch-shell-ready\\036"; cat | exec "$0"'
_PIPED_COMMAND = 'stty -echo -onlcr 2>/dev/null; printf "\\036monarch-shell-ready\\036"; "$@"'


@click.command("shell", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                     "allow_interspersed_args": False})
@click.option("--host", type=int, default=0, show_default=True, help="Host rank to open the shell on.")
@name_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def shell(ctx: click.Context, host: int, name: str | None, command: tuple[str, ...]) -> None:
    """Open an interactive shell on a reserved host (exit the shell to come back).

    `monarch shell --host 1 CMD ARGS...` runs one command there; piped (`echo ls | monarch shell`),
    only the output comes back, as with ssh.  With --json its output goes to stderr and stdout
    holds {"host", "command", "exit_code", "output"}.
    """
    from monarch._workbench.reserve import load_live
    from monarch._workbench.shell import RemoteShell
    as_json = opts(ctx).json
    with handled(ctx):
        record, _ = load_live(name)
        by_rank = {h.host_rank: h for h in record.hosts}
        if host not in by_rank:
            raise UsageError(f"no host rank {host} in this reservation (it has 0..{len(record.hosts) - 1})")
        target = by_rank[host]
        rows, cols = _size()
        stdin = sys.stdin.fileno()
        is_tty = os.isatty(stdin)
        shell_path = os.environ.get("SHELL", "/bin/bash")
        argv = list(command or []) or [shell_path, "-i"]
        if not is_tty:
            argv = ["sh", "-c", _PIPED_COMMAND, "sh", *command] if command else ["sh", "-c", _PIPED_SHELL, shell_path]
        env = {"TERM": os.environ.get("TERM", "xterm"), "MONARCH_HOST_RANK": str(target.host_rank)}
        captured: list[bytes] = []
        ready = threading.Event()
        before_ready = bytearray()
        if is_tty:
            ready.set()

        def on_output(data: bytes) -> None:
            if not ready.is_set():
                before_ready.extend(data)
                at = before_ready.find(_READY)
                if at < 0:
                    return
                data = bytes(before_ready[at + len(_READY):])
                ready.set()
            if as_json:  # stdout holds the one document: the output goes to stderr (and into it)
                captured.append(data)
                os.write(sys.stderr.fileno(), data)
            else:
                os.write(sys.stdout.fileno(), data)

        sh = RemoteShell(record, target, argv, env=env, cwd=os.getcwd(), rows=rows, cols=cols, on_output=on_output)
        sh.start()
        saved = termios.tcgetattr(stdin) if is_tty else None
        old_winch = signal.signal(signal.SIGWINCH, lambda *_: sh.resize(*_size()))
        try:
            if is_tty:
                tty.setraw(stdin)
            while not sh.done.is_set():
                if not ready.wait(0.1):
                    continue
                readable, _, _ = select.select([stdin], [], [], 0.1)
                if readable:
                    data = os.read(stdin, 4096)
                    if not data:
                        # stdin closed: send EOF (Ctrl-D) and let the shell finish, however long it takes.
                        sh.send(b"\x04")
                        sh.wait()
                        break
                    sh.send(data)
        finally:
            if saved is not None:
                termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
            signal.signal(signal.SIGWINCH, old_winch)
        if getattr(sh, "agent_lost", False):
            # One exit-code table: a lost agent is 5 here as for `monarch run`, not 255.
            raise AgentError(sh.reason, "`monarch status` shows which agents answer")
        code = sh.exit_code if sh.exit_code is not None else 0
        if code < 0:  # killed by signal N: 128+N, as a shell says it
            code = 128 - code
        if as_json:
            print_json({"host": target.host_rank, "command": list(command or []), "exit_code": code,
                        "output": b"".join(captured).decode(errors="replace")})
        raise click.exceptions.Exit(code)


def _size() -> tuple[int, int]:
    s = shutil.get_terminal_size((80, 24))
    return s.lines, s.columns
