"""Ranks and actors paused in pdb (the sessions of `monarch debug list`)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from monarch_cli.tui.text import safe


class DebugView(DataTable):
    """One row per debug session; `monarch debug` (or `attach ID` in it) takes over a session."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns("id", "rank", "host", "pid", "what", "where", "function", "state", "held by")

    def show(self, sessions: list[Any]) -> None:
        keep = self.cursor_row
        self.clear()
        for s in sessions:
            what = s.actor or s.command or s.name
            self.add_row(str(s.id), str(s.rank), s.host, str(s.pid), safe(what, 60), s.where, safe(s.function, 40),
                         Text("waiting", "magenta") if s.waiting else Text("running", "green"), s.held_by or "-")
        if sessions and keep is not None:
            self.move_cursor(row=min(keep, len(sessions) - 1))
