"""A yes/no question before an action that cannot be undone (stop a run), and a notice to read and close."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmScreen(ModalScreen[bool]):
    """Asks ``question``; dismisses with True for yes (y, Enter on Yes) and False for no (n, Esc)."""

    BINDINGS = [("y", "answer(True)", "Yes"), ("n", "answer(False)", "No"), ("escape", "answer(False)", "No")]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Grid(id="confirm-dialog"):
            yield Label(self.question, id="confirm-question")
            yield Button("Yes (y)", variant="error", id="confirm-yes")
            yield Button("No (n)", variant="primary", id="confirm-no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class NoticeScreen(ModalScreen[None]):
    """``message`` and a line to copy (a command to run elsewhere); Enter, Esc or OK closes it."""

    BINDINGS = [("escape", "close", "Close"), ("enter", "close", "Close")]

    def __init__(self, message: str, line: str):
        super().__init__()
        self.message = message
        self.line = line

    def compose(self) -> ComposeResult:
        with Grid(id="notice-dialog"):
            yield Label(self.message, id="notice-message")
            yield Static(self.line, id="notice-line", markup=False)
            yield Button("OK", variant="primary", id="notice-ok")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
