"""Current and past `monarch run`s, and the ranks of the one selected (exit codes, durations)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from monarch_cli.tui.source import RunView, Snapshot
from monarch_cli.tui.text import duration, safe, style_of


def _span(started: Any, ended: Any, now: float) -> str:
    if started is None:
        return "-"
    end = ended.timestamp() if ended is not None else now
    return duration(end - started.timestamp())


class RunsView(Vertical):
    """Runs (newest first); Enter shows the selected run's logs."""

    class ShowLogs(Message):
        def __init__(self, run_id: str):
            super().__init__()
            self.run_id = run_id

    def compose(self) -> ComposeResult:
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Static("ranks of the selected run", id="ranks-title")
        yield DataTable(id="ranks-table", cursor_type="row")

    def on_mount(self) -> None:
        self.query_one("#runs-table", DataTable).add_columns("run", "status", "ranks", "failed", "started", "took", "command")
        self.query_one("#ranks-table", DataTable).add_columns("rank", "host", "pid", "exit", "signal", "took", "reason")
        self._runs: list[RunView] = []
        self._now = 0.0
        #: Ranks of older runs, fetched when one is selected (a poll brings only the newest run's).
        self._ranks_of: dict[str, list[dict]] = {}

    @property
    def selected(self) -> RunView | None:
        table = self.query_one("#runs-table", DataTable)
        if not self._runs or table.cursor_row is None or table.cursor_row >= len(self._runs):
            return None
        return self._runs[table.cursor_row]

    def show(self, snap: Snapshot) -> None:
        table = self.query_one("#runs-table", DataTable)
        keep = self.selected.run_id if self.selected else None
        self._runs, self._now = snap.runs, snap.taken_at
        table.clear()
        for r in snap.runs:
            table.add_row(r.run_id, Text(r.status, style_of(r.status)), str(r.num_ranks),
                          Text(str(r.failed_ranks), "bold red" if r.failed_ranks else ""),
                          r.started.strftime("%H:%M:%S") if r.started else "-",
                          _span(r.started, r.ended, snap.taken_at), safe(r.argv, 200), key=r.run_id)
        ids = [r.run_id for r in snap.runs]
        if keep in ids:
            table.move_cursor(row=ids.index(keep))
        self._show_ranks()

    def _show_ranks(self) -> None:
        run = self.selected
        if run is not None and not run.ranks and (run.run_id not in self._ranks_of or run.ended is None):
            self.fetch_ranks(run.run_id)  # a run still going is asked again at each refresh
        self._draw_ranks(run)

    @work(thread=True, exclusive=True, group="ranks")
    def fetch_ranks(self, run_id: str) -> None:
        try:
            rows = self.app.source.run_ranks(run_id)
        except Exception:  # the next refresh asks again; the banner says what is wrong with the reservation
            return
        self.app.call_from_thread(self._got_ranks, run_id, rows)

    def _got_ranks(self, run_id: str, rows: list[dict]) -> None:
        self._ranks_of[run_id] = rows
        if self.selected is not None and self.selected.run_id == run_id:
            self._draw_ranks(self.selected)

    def _draw_ranks(self, run: RunView | None) -> None:
        ranks = self.query_one("#ranks-table", DataTable)
        ranks.clear()
        if run is None:
            return
        for r in run.ranks or self._ranks_of.get(run.run_id, []):
            code = r["exit_code"]
            ranks.add_row(str(r["rank"]), r["host"], str(r["pid"]),
                          Text("-" if code is None else str(code), "bold red" if code else "green"),
                          str(r["signal"] or ""), _span(r["started"], r["ended"], self._now), safe(r["reason"] or "", 200))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "runs-table":
            event.stop()
            self._show_ranks()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "runs-table" and self.selected:
            event.stop()
            self.post_message(self.ShowLogs(self.selected.run_id))
