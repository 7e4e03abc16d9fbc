"""Every line the ranks of a run printed: follow mode, filters, jump to the first error."""

from __future__ import annotations

import re
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Log, Static

from monarch_cli.tui.text import safe

#: What counts as an error line for "jump to the first error".
ERROR_RE = re.compile(r"Traceback \(most recent call last\)|\b\w*(Error|Exception)\b|\bFAILED\b|\bfatal\b", re.I)


@dataclass
class LogFilter:
    """``rank:N host:NAME stream:stderr`` and free text (all must match)."""

    rank: int | None = None
    host: str | None = None
    stream: str | None = None
    text: str = ""

    @classmethod
    def parse(cls, s: str) -> "LogFilter":
        f, words = cls(), []
        for tok in s.split():
            key, sep, val = tok.partition(":")
            if sep and key == "rank" and val.lstrip("-").isdigit():
                f.rank = int(val)
            elif sep and key == "host":
                f.host = val
            elif sep and key == "stream":
                f.stream = val if val.startswith("std") else f"std{val}"
            else:
                words.append(tok)
        f.text = " ".join(words).lower()
        return f

    def keep(self, row: dict) -> bool:
        return ((self.rank is None or row.get("rank") == self.rank)
                and (self.host is None or row.get("host") == self.host)
                and (self.stream is None or row.get("stream") == self.stream)
                and (not self.text or self.text in (row.get("line") or "").lower()))


def format_line(row: dict) -> str:
    who = f"{row['host']}/{row['rank']}" if row.get("rank") is not None else f"{row['host']}/{row.get('proc') or '?'}"
    mark = "!" if row.get("stream") == "stderr" else " "
    return f"{who}{mark} {safe(row.get('line') or '', total=row.get('line_chars'))}"


class LogsView(Vertical):
    """The logs of one run (the latest unless one was chosen in Runs)."""

    def compose(self) -> ComposeResult:
        with Horizontal(id="logs-bar"):
            yield Input(placeholder="filter: text  rank:N  host:NAME  stream:stderr", id="log-filter")
            yield Static("", id="log-status")
        yield Log(id="log-view", highlight=False, max_lines=None)

    def on_mount(self) -> None:
        self.run_id: str | None = None
        self.follow = True
        self.filter = LogFilter()
        self._rows: list[dict] = []
        self._shown: list[str] = []

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "log-filter":
            event.stop()
            self.filter = LogFilter.parse(event.value)
            self._redraw()

    def show_rows(self, run_id: str | None, rows: list[dict]) -> None:
        self._rows = rows
        self._status(run_id)
        self._redraw()

    def _status(self, run_id: str | None) -> None:
        self.query_one("#log-status", Static).update(
            f"run {run_id or '-'} · {'following' if self.follow else 'paused'} (f) · first error (e)")

    def _redraw(self) -> None:
        lines = [format_line(r) for r in self._rows if self.filter.keep(r)]
        log = self.query_one("#log-view", Log)
        if lines == self._shown:
            return
        if self._shown and lines[:len(self._shown)] == self._shown:
            log.write_lines(lines[len(self._shown):], scroll_end=self.follow)
        else:
            log.clear()
            log.write_lines(lines, scroll_end=self.follow)
        self._shown = lines

    def toggle_follow(self) -> None:
        self.follow = not self.follow
        self.query_one("#log-view", Log).auto_scroll = self.follow
        if self.follow:
            self.query_one("#log-view", Log).scroll_end(animate=False)
        self._status(self.run_id)

    def jump_to_first_error(self) -> int | None:
        """Scroll to the first error line shown (follow stops); its index, or None."""
        for i, line in enumerate(self._shown):
            if ERROR_RE.search(line):
                if self.follow:
                    self.toggle_follow()
                log = self.query_one("#log-view", Log)
                log.scroll_to(y=i, animate=False)
                log.focus()
                return i
        self.app.notify("no error in the lines shown", severity="information")
        return None
