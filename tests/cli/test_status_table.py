"""``monarch status``'s tables: Rich on a terminal for a few rows, plain aligned columns for many or piped."""

from __future__ import annotations

import io

from rich.console import Console

from monarch_cli.commands import status

HEADERS = ("rank", "host", "agent")


def _rows(n: int) -> list[list[tuple[str, str]]]:
    return [[(str(i), ""), (f"host{i}", ""), ("up" if i else "down [x]", "green" if i else "red")] for i in range(n)]


def _printed(monkeypatch, rows, terminal: bool) -> str:
    buf = io.StringIO()
    monkeypatch.setattr(status, "out", Console(file=buf, force_terminal=terminal, width=80, highlight=False,
                                               soft_wrap=True, color_system="standard" if terminal else None))
    status._print_table(HEADERS, rows)
    return buf.getvalue()


def test_many_rows_on_a_terminal_are_plain_aligned_columns_with_colours(monkeypatch):
    text = _printed(monkeypatch, _rows(status._RICH_ROWS + 1), terminal=True)
    lines = text.splitlines()
    assert len(lines) == status._RICH_ROWS + 2 and "┃" not in text
    assert "\x1b[31mdown [x]\x1b[0m" in lines[1]  # the cell's own brackets kept, its colour given
    plain = [line.replace("\x1b[1m", "").replace("\x1b[0m", "").replace("\x1b[32m", "").replace("\x1b[31m", "")
             for line in lines]
    assert plain[0].split() == list(HEADERS)
    # Every column starts at the same place on every line.
    assert len({line.index("host") for line in plain[1:]}) == 1


def test_piped_rows_are_plain_without_escapes(monkeypatch):
    text = _printed(monkeypatch, _rows(3), terminal=False)
    assert text.splitlines() == [" rank  host   agent", " 0     host0  down [x]", " 1     host1  up",
                                 " 2     host2  up"]


def test_few_rows_on_a_terminal_are_a_rich_table(monkeypatch):
    text = _printed(monkeypatch, _rows(3), terminal=True)
    assert "┃" in text and "down [x]" in text
