"""Ranks and actors paused in pdb (the sessions of `monarch debug list`); Enter attaches to one."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from monarch_cli.tui.text import safe


class DebugView(DataTable):
    """One row per debug session; Enter attaches to it in the pdb pane below."""

    class Attach(Message):
        """Attach to the debug session shown as ``session_id``."""

        def __init__(self, session_id: int):
            super().__init__()
            self.session_id = session_id

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns("id", "rank", "host", "pid", "what", "where", "function", "state", "held by")

    def show(self, sessions: list[Any]) -> None:
        keep = self.cursor_row
        self.clear()
        for s in sessions:
            what = s.actor or s.command or s.name
            self.add_row(str(s.id), str(s.rank), s.host, str(s.pid), safe(what, 60), s.where, safe(s.function, 40),
                         Text("waiting", "magenta") if s.waiting else Text("running", "green"), s.held_by or "-",
                         key=str(s.id))
        if sessions and keep is not None:
            self.move_cursor(row=min(keep, len(sessions) - 1))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Attach(int(event.row_key.value)))
