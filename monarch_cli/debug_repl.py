"""The ``monarch_dbg>`` prompt: commands, attached pdb sessions, cast and continue.

Attached, this terminal behaves as a local pdb's would: the rank's pdb prompt is
shown with readline (line editing, history, tab completion from the rank), Ctrl-C
interrupts the rank's running command (at the prompt, pdb says --KeyboardInterrupt--),
Ctrl-D is end of input to pdb (when commands are piped in, it detaches instead: a
script's end must not quit the rank).  ``detach`` returns to ``monarch_dbg>``.
"""

from __future__ import annotations

import codecs
import queue
import re
import signal
import sys
import threading
from typing import TYPE_CHECKING

from monarch_cli import debug_grammar as g

if TYPE_CHECKING:
    from monarch._workbench.debug import Attachment, DebugClient, DebugSessionInfo

PROMPT = "monarch_dbg> "
#: Control characters a rank's output may hold, shown escaped (raw, they could wreck the terminal).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: A partial line with no more output after this long is shown anyway (a progress line).
_PARTIAL_FLUSH_S = 0.3
#: How long `cast` and `continue` wait for each rank before saying it is still running.
_CAST_WAIT_S = 60.0


def clean(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def session_table(sessions: list[DebugSessionInfo]) -> str:
    """The sessions as ``list`` shows them."""
    if not sessions:
        return "no debug sessions (a rank that calls breakpoint() shows up here)\n"
    rows = [("id", "rank", "host", "actor/command", "where", "function", "state")]
    for s in sessions:
        state = f"held by {s.held_by}" if s.held_by else ("waiting" if s.waiting else "running")
        if s.kind == "post_mortem":
            state += " (post-mortem)"
        what = s.actor or s.command
        rows.append((str(s.id), str(s.rank), s.host, what[:40], s.where, s.function, state))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in rows)


class DebugPrompt:
    """One ``monarch debug`` session at the terminal (or reading a script on stdin)."""

    def __init__(self, client: DebugClient, stdin=None, stdout=None):
        self.client = client
        self.stdin = stdin or sys.stdin
        self.out = stdout or sys.stdout
        self.tty = self.stdin.isatty()
        self.current: Attachment | None = None
        if self.tty:
            self._setup_readline()

    # -- terminal ------------------------------------------------------------------

    def _setup_readline(self) -> None:
        try:
            import readline
        except ImportError:
            return
        readline.set_completer_delims(" \t\n`~!@#$%^&*()-=+[{]}\\|;:'\",<>/?")
        readline.parse_and_bind("tab: complete")
        readline.set_completer(self._complete)
        self._readline = readline
        self._matches: list[str] = []

    def _complete(self, text: str, state: int) -> str | None:
        if state == 0:
            rl = self._readline
            if self.current is not None:
                self._matches = self.current.complete(text, rl.get_line_buffer(), rl.get_begidx(), rl.get_endidx())
            else:
                words = ["attach", "cast", "continue", "help", "list", "quit"]
                self._matches = [w for w in words if w.startswith(text)] if rl.get_begidx() == 0 else []
        return self._matches[state] if state < len(self._matches) else None

    def write(self, text: str) -> None:
        from monarch._workbench.run import write_whole

        write_whole(self.out, text)  # whole even when this process is stopped and continued mid-write

    def read(self, prompt: str) -> str:
        """One line; EOFError at end of input, KeyboardInterrupt on Ctrl-C."""
        if self.tty or self.stdin is sys.stdin:
            return input(prompt)
        self.write(prompt)
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    # -- the prompt ------------------------------------------------------------------

    def loop(self) -> None:
        self.write("\n************************ MONARCH DEBUGGER ************************\n"
                   "Enter 'help' for a list of commands.\nEnter 'list' to show all active breakpoints.\n\n")
        while True:
            try:
                line = self.read(PROMPT)
            except EOFError:
                self.write("\n" if self.tty else "")
                return
            except KeyboardInterrupt:
                self.write("\n")
                continue
            if not line.strip():
                continue
            try:
                cmd = g.parse(line)
            except g.ParseError as e:
                self.write(f"{e}\n")
                continue
            if isinstance(cmd, g.Quit):
                return
            try:
                self.dispatch(cmd)
            except KeyboardInterrupt:
                self.write("\n")
            except Exception as e:  # one line, and the prompt again
                from monarch.errors import MonarchError

                text = e.message if isinstance(e, MonarchError) else (str(e).strip().splitlines() or [type(e).__name__])[0]
                self.write(f"Error: {text}\n")

    def dispatch(self, cmd: g.Command) -> None:
        if isinstance(cmd, g.Help):
            self.write(g.HELP)
        elif isinstance(cmd, g.ListSessions):
            sessions = self.client.refresh()
            for bad in self.client.unreachable:
                self.write(f"warning: host agent {bad} did not answer\n")
            self.write(session_table(sessions))
        elif isinstance(cmd, g.Attach):
            s = self.client.find(cmd.id) if cmd.id is not None else self.client.find_actor(cmd.name, cmd.rank)
            self.attach(s)
        elif isinstance(cmd, g.Cast):
            self.cast(cmd)
        elif isinstance(cmd, g.Continue):
            self.continue_all()

    # -- attached ------------------------------------------------------------------------

    def attach(self, s: DebugSessionInfo) -> None:
        a = self.client.attach(s)
        label = f"{a.info.actor or a.info.name} {a.info.rank} ({a.info.host})"
        self.write(f"Attached to debug session for {label}\n")
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        tail = ""
        if a.replay:
            self.write(f"<last pdb output for {label} follows>\n")
            tail = self._show(decoder.decode(a.replay), "")
        waiting = a.waiting
        self.current = a
        reading = threading.Event()
        main = threading.get_ident()

        def wake_reader() -> None:
            # The rank went away while this terminal waits for a pdb command: stop waiting.
            if reading.is_set():
                signal.pthread_kill(main, signal.SIGINT)

        a.on_end = wake_reader
        try:
            while True:
                if not waiting:
                    waiting, tail, ended = self._pump(a, decoder, tail)
                    if ended is not None:
                        self.write(f"{tail}\nDebug session for {label} ended: {ended}\n" if tail else
                                   f"Debug session for {label} ended: {ended}\n")
                        return
                try:
                    reading.set()
                    if a.ended is not None:
                        raise KeyboardInterrupt
                    line = self.read(tail)
                except KeyboardInterrupt:
                    if a.ended is not None:
                        self.write(f"\nDebug session for {label} ended: {a.ended}\n")
                        return
                    # As at a local pdb prompt: pdb says --KeyboardInterrupt-- and asks again.
                    self.write("\n")
                    a.interrupt()
                    tail, waiting = "", False
                    continue
                except EOFError:
                    if a.ended is not None:
                        self.write(f"\nDebug session for {label} ended: {a.ended}\n")
                        return
                    if not self.tty:  # the script ended: leave the rank paused
                        break
                    self.write("\n")
                    a.send_eof()
                    tail, waiting = "", False
                    continue
                finally:
                    reading.clear()
                if line.strip() == "detach":
                    break
                a.send_line(line)
                tail, waiting = "", False
        finally:
            a.on_end = None
            self.current = None
        a.detach()
        self.write(f"Detached from debug session for {label}\n")

    def _pump(self, a: Attachment, decoder, tail: str) -> tuple[bool, str, str | None]:
        """Show the rank's output until its pdb waits (or the session ends); Ctrl-C interrupts the rank."""
        while True:
            try:
                kind, value = a.events.get(timeout=_PARTIAL_FLUSH_S)
            except queue.Empty:
                if tail:
                    self.write(clean(tail))
                    tail = ""
                continue
            except KeyboardInterrupt:
                a.interrupt()
                continue
            if kind == "out":
                tail = self._show(decoder.decode(value), tail)
            elif kind == "waiting":
                return True, tail, None
            else:
                return False, clean(tail), value

    def _show(self, text: str, tail: str) -> str:
        """Write whole lines; return the partial last line (the prompt, once pdb waits)."""
        text = tail + text
        cut = text.rfind("\n") + 1
        if cut:
            self.write(clean(text[:cut]))
        return clean(text[cut:])

    # -- several ranks at once -----------------------------------------------------------

    def _targets(self, name: str, sel: g.RankSel | None) -> list[DebugSessionInfo]:
        sessions = self.client.refresh()
        return [s for s in sessions if (not name or name in (s.name, s.actor))
                and (sel is None or g.selects(sel, s.rank, s.coords))]

    def cast(self, cmd: g.Cast) -> None:
        targets = self._targets(cmd.name, cmd.ranks)
        if not targets:
            self.write(f"Error: no debug session matches {('%s ' % cmd.name) if cmd.name else ''}ranks({_show_sel(cmd.ranks)})\n")
            return
        self._each(targets, [cmd.command], label_output=True)

    def continue_all(self) -> None:
        targets = self._targets("", None)
        if not targets:
            self.write("no debug sessions to continue\n")
            return
        self._each(targets, ["clear", "c"], label_output=False)

    def _each(self, targets: list[DebugSessionInfo], lines: list[str], *, label_output: bool) -> None:
        from monarch._workbench.debug import DebugError

        held = []
        for s in targets:
            try:
                held.append(self.client.attach(s))
            except DebugError as e:
                self.write(f"[rank {s.rank}] Error: {e.message}\n")
        try:
            for line in lines:
                for a in held:
                    if a.ended is None:
                        a.send_line(line)
                for a in held:
                    out, ended = self._collect(a)
                    text = clean(out.decode("utf-8", "replace"))
                    if text.endswith("(Pdb) "):
                        text = text[:-len("(Pdb) ")]
                    if label_output:
                        for row in text.splitlines():
                            self.write(f"[rank {a.info.rank}] {row}\n")
                    if ended is not None and (label_output or line == lines[-1]):
                        self.write(f"[rank {a.info.rank}] session ended: {ended}\n" if label_output else f"{ended}\n")
        finally:
            for a in held:
                a.detach()

    def _collect(self, a: Attachment) -> tuple[bytes, str | None]:
        try:
            if a.ended is not None and a.events.empty():
                return b"", a.ended
            return a.run_until_waiting(None, timeout=_CAST_WAIT_S)
        except KeyboardInterrupt:
            a.interrupt()
            return a.run_until_waiting(None, timeout=2.0)


def _show_sel(sel: g.RankSel) -> str:
    if isinstance(sel, range):
        stop = "" if sel.stop >= sys.maxsize else str(sel.stop)
        return f"{sel.start}:{stop}:{sel.step}"
    if isinstance(sel, list):
        return ",".join(map(str, sel))
    if isinstance(sel, dict):
        return ", ".join(f"{k}={_show_sel(v)}" for k, v in sel.items())
    return str(sel)

