"""A debug session held inside the dashboard: the rank's pdb output and a command line.

It talks to the session as `monarch debug`'s ``attach`` does (``monarch._workbench.debug``:
``DebugClient.attach`` and the ``Attachment`` it returns): lines typed go to the rank's
pdb, its output comes back, Ctrl-C interrupts the command it runs.  ``detach`` (or Esc)
leaves the rank paused in pdb for the next debugger; ``c`` lets it run on and ends the session.
"""

from __future__ import annotations

import codecs
import queue
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Label, Log, Static

from monarch_cli.tui.text import safe

#: A partial line with no more output after this long is shown anyway (a progress line).
PARTIAL_FLUSH_S = 0.3
#: pdb output kept in the pane.
PANE_LINES = 5000


class PdbPane(Vertical):
    """Enter on a session attaches here; type pdb commands (bt, p x, n, c); Esc detaches."""

    BINDINGS = [
        Binding("escape", "leave", "Detach"),
        # Before the line's own ctrl+c (copy): in a debugger it stops the rank's running command.
        Binding("ctrl+c", "interrupt", "Interrupt", priority=True),
    ]

    class Closed(Message):
        """The pane was closed (the sessions table takes the keys again)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="pdb-status")
        yield Log(id="pdb-log", highlight=False, max_lines=PANE_LINES)
        with Horizontal(id="pdb-line"):
            yield Label("(Pdb) ", id="pdb-prompt")
            yield Input(placeholder="pdb command: bt, p x, n, c · detach (Esc) leaves the rank paused", id="pdb-input")

    def on_mount(self) -> None:
        #: The session held now (a monarch._workbench.debug.Attachment), or None.
        self.attachment: Any = None
        #: What the held session is called in this pane ("session 3: rank 1 on host1").
        self.label = ""
        #: pdb's prompt (the partial last line of its output while it waits for a command).
        self.prompt = "(Pdb) "
        #: Attach requests so far; an answer to an older one (the user moved on) is let go at once.
        self._asked = 0

    # -- attaching --------------------------------------------------------------------------

    def attach(self, session_id: int) -> None:
        """Hold session ``session_id`` (detaching from the one held before, which stays paused)."""
        self.detach()
        self._asked += 1
        self.add_class("-open")
        self.query_one("#pdb-log", Log).clear()
        self._status(Text(f"attaching to session {session_id}…", "dim"))
        self._hold(session_id, self._asked)

    @work(thread=True, group="pdb-attach")
    def _hold(self, session_id: int, asked: int) -> None:
        from monarch.errors import MonarchError

        try:
            a = self.app.source.attach_debug(session_id)
        except MonarchError as e:
            self.app.call_from_thread(self._failed, session_id, asked, e.message)
            return
        except Exception as e:  # a runtime or transport error: still one line, not a crash
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self.app.call_from_thread(self._failed, session_id, asked, why)
            return
        self.app.call_from_thread(self._attached, session_id, asked, a)

    def _failed(self, session_id: int, asked: int, why: str) -> None:
        if asked != self._asked or not self.has_class("-open"):
            return
        self._status(Text.assemble(("cannot attach to session ", "bold red"), (str(session_id), "bold red"),
                                   (f": {safe(why, 300)}", "red"), ("  (Esc closes)", "dim")))
        self.query_one("#pdb-input", Input).focus()

    def _attached(self, session_id: int, asked: int, a: Any) -> None:
        if asked != self._asked or not self.has_class("-open"):
            a.detach()  # closed or asked for another session meanwhile: the rank stays paused
            return
        info = a.info
        self.attachment = a
        self.label = f"session {session_id}: {info.actor or info.name} rank {info.rank} on {info.host}"
        self._status(Text.assemble(("attached to ", "bold magenta"), (self.label, "bold"),
                                   f" at {info.where}", (" · detach (Esc) leaves it paused · c continues", "dim")))
        self.query_one("#pdb-input", Input).focus()
        self._pump(a)

    @work(thread=True, group="pdb-pump")
    def _pump(self, a: Any) -> None:
        """Hand the session's output to the pane line by line until it ends or is detached."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        tail = ""
        if a.replay:
            self.app.call_from_thread(self._write, ["<last pdb output follows>"])
            tail = self._lines(decoder.decode(a.replay), tail)
        if a.waiting:
            self.app.call_from_thread(self._waiting, a, tail)
            tail = ""
        while self.attachment is a and a.ended is None:
            try:
                kind, value = a.events.get(timeout=PARTIAL_FLUSH_S)
            except queue.Empty:
                if tail:
                    self.app.call_from_thread(self._write, [tail])
                    tail = ""
                continue
            if kind == "out":
                tail = self._lines(decoder.decode(value), tail)
            elif kind == "waiting":
                self.app.call_from_thread(self._waiting, a, tail)
                tail = ""
            else:
                lines = [tail] if tail else []
                self.app.call_from_thread(self._ended, a, lines, value)
                return

    def _lines(self, text: str, tail: str) -> str:
        """Write the whole lines of ``tail + text`` (pump thread); return the partial last line."""
        text = tail + text
        cut = text.rfind("\n") + 1
        if cut:
            self.app.call_from_thread(self._write, text[:cut].splitlines())
        return text[cut:]

    def _write(self, lines: list[str]) -> None:
        self.query_one("#pdb-log", Log).write_lines([safe(line) for line in lines])

    def _waiting(self, a: Any, prompt: str) -> None:
        if a is self.attachment:
            self.prompt = safe(prompt, 80) or "(Pdb) "
            self.query_one("#pdb-prompt", Label).update(self.prompt)
            self.set_class(True, "-waiting")

    def _ended(self, a: Any, lines: list[str], reason: str) -> None:
        if lines:
            self._write(lines)
        self._write([f"session ended: {reason}"])
        if a is self.attachment:
            self.attachment = None
            self.set_class(False, "-waiting")
            self._status(Text.assemble(("ended: ", "bold"), self.label, f" ({safe(reason, 200)})",
                                       ("  (Esc closes)", "dim")))

    # -- typing -----------------------------------------------------------------------------

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "pdb-input":
            return
        event.stop()
        line = event.value
        event.input.value = ""
        a = self.attachment
        if a is None:
            self._write(["not attached: Enter on a session in the list above attaches"])
            return
        if line.strip() == "detach":
            self.action_leave()
            return
        self._write([self.prompt + line])
        self.set_class(False, "-waiting")
        a.send_line(line)

    def action_interrupt(self) -> None:
        """Ctrl-C: as at a local pdb, the rank's running command gets KeyboardInterrupt."""
        if self.attachment is not None:
            self._write(["^C"])
            self.attachment.interrupt()

    def action_leave(self) -> None:
        """Esc: detach (the rank stays paused in pdb); Esc again, or with nothing held, closes the pane."""
        if self.attachment is not None:
            label = self.label
            self.detach()
            self._write([f"detached from {label}: it waits in pdb for the next debugger"])
            self._status(Text.assemble(("detached from ", "bold"), label, ("  (Esc closes)", "dim")))
            return
        self._asked += 1  # an attach still under way is let go when it answers
        self.remove_class("-open")
        self.post_message(self.Closed())

    def detach(self) -> None:
        """Let go of the held session, if any; pdb keeps it paused."""
        a, self.attachment = self.attachment, None
        self.set_class(False, "-waiting")
        if a is not None:
            a.detach()

    def on_unmount(self) -> None:
        self.detach()

    def _status(self, text: Text) -> None:
        self.query_one("#pdb-status", Static).update(text)
