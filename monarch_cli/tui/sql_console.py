"""Type SQL over every host's telemetry (as `monarch query`), see a table; history; errors inline."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Input, Static

from monarch_cli.tui.text import safe

#: Rows a query shows at most (the table stays responsive).
ROW_LIMIT = 1000


class SqlConsole(Vertical):
    """A query line (Up/Down: history), the answer as a table, errors in red below the line."""

    BINDINGS = [("up", "history(-1)", "Older query"), ("down", "history(1)", "Newer query")]

    def compose(self) -> ComposeResult:
        yield Input(placeholder="SQL, e.g. SELECT host, status, count(*) FROM procs GROUP BY host, status  (Enter runs)",
                    id="sql-input")
        yield Static("", id="sql-message")
        yield DataTable(id="sql-table", zebra_stripes=True)

    def on_mount(self) -> None:
        self.history: list[str] = []
        self._at = 0

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "sql-input":
            return
        event.stop()
        sql = event.value.strip()
        if not sql:
            return
        if not self.history or self.history[-1] != sql:
            self.history.append(sql)
        self._at = len(self.history)
        # The line is emptied for the next query (Up brings this one back): typing then starts a new
        # query instead of appending to the old one.
        event.input.value = ""
        self.query_one("#sql-message", Static).update(Text("running…", "dim"))
        self.run_sql(sql)

    def action_history(self, step: int) -> None:
        if not self.history:
            return
        self._at = max(0, min(len(self.history), self._at + step))
        inp = self.query_one("#sql-input", Input)
        inp.value = self.history[self._at] if self._at < len(self.history) else ""
        inp.cursor_position = len(inp.value)

    @work(thread=True, exclusive=True, group="sql")
    def run_sql(self, sql: str) -> None:
        from monarch.errors import MonarchError

        try:
            result = self.app.source.query(sql, timeout_s=10.0, row_limit=ROW_LIMIT)
        except MonarchError as e:  # its message and hint apart (str(e) carries the hint too)
            self.app.call_from_thread(self._error, e.message, e.hint or "")
            return
        except Exception as e:  # the query engine's own errors carry no MonarchError
            self.app.call_from_thread(self._error, f"{type(e).__name__}: {e}", "")
            return
        self.app.call_from_thread(self._show, result)

    def _error(self, message: str, hint: str) -> None:
        t = Text.assemble(("error: ", "bold red"), (safe(message), "red"))
        if hint:
            t.append(f"\n{hint}", style="dim")
        self.query_one("#sql-message", Static).update(t)

    def _show(self, result: Any) -> None:
        table = self.query_one("#sql-table", DataTable)
        table.clear(columns=True)
        t = result.table
        table.add_columns(*t.column_names)
        for row in t.to_pylist():
            table.add_row(*("" if v is None else safe(str(v), 300) for v in row.values()))
        msg = Text(f"{t.num_rows} row{'s' if t.num_rows != 1 else ''}", "green")
        if result.limited:
            msg.append(f" (the first {ROW_LIMIT})", "yellow")
        for host in result.missing_hosts:
            msg.append(f" · {host} did not answer", "yellow")
        self.query_one("#sql-message", Static).update(msg)
