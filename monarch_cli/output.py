"""Printing: data to stdout (a table or --json), talk and progress to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any



class _LazyConsole:
    """A Rich console made on first use: importing Rich costs tens of ms that
    ``monarch run`` piped into a file never needs."""

    def __init__(self, **kwargs: Any):
        self._kwargs = kwargs
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


# soft_wrap: a long error line stays one line (Rich would wrap it at 80 columns when piped).
out = _LazyConsole(highlight=False, soft_wrap=True)
err = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def escape(text: str) -> str:
    """``text`` with Rich markup characters escaped (Rich is imported only when there is text to print)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def rich_would_style(fd: int) -> bool:
    """Whether Rich would treat descriptor ``fd`` as a terminal (escape codes, styles): a tty, or
    forced by the environment (FORCE_COLOR, TTY_COMPATIBLE)."""
    import os

    if "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ:
        return True
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _rich_width() -> int:
    """The width Rich's console takes here: COLUMNS, else the first terminal among stdin, stdout,
    stderr, else 80 (rich.console.Console.size)."""
    import os

    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns) or 80
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or 80
        except (OSError, ValueError):
            continue
    return 80


def _plain_cell(text: str) -> bool:
    """A cell Rich prints as it is: printable ASCII without a backslash (``escape`` and markup do not
    give every one back as it was), and no emoji code (``:name:``) it would replace."""
    if not (text.isascii() and text.isprintable()) or "\\" in text:
        return False
    if ":" in text:
        from rich._emoji_replace import _emoji_replace

        return _emoji_replace(text) == text
    return True


def plain_table(columns: list[str], rows: list[list[str]]) -> str | None:
    """``rows`` drawn exactly as ``rich.table.Table(*columns)`` prints them to a console that is not a
    terminal (no styles): without Rich's layout, which costs ~0.2 ms a row (a query at 256 hosts:
    60 ms of CPU).  None where Rich could draw it otherwise (a terminal, markup in a header, a cell
    that is not plain ASCII or holds an emoji code, a table wider than the console): ask Rich."""
    if rich_would_style(1) or not columns:
        return None
    if any("[" in c or not c or not _plain_cell(c) for c in columns):
        return None  # headers are markup to Rich
    widths = [len(c) for c in columns]
    for row in rows:
        if len(row) != len(columns):
            return None
        for i, cell in enumerate(row):
            if not _plain_cell(cell):
                return None
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    if sum(widths) + 3 * len(widths) + 1 > _rich_width():
        return None  # Rich would wrap or squeeze the columns
    lines = ["┏" + "┳".join("━" * (w + 2) for w in widths) + "┓",
             "┃" + "┃".join(f" {c.ljust(w)} " for c, w in zip(columns, widths)) + "┃",
             "┡" + "╇".join("━" * (w + 2) for w in widths) + "┩"]
    lines.extend("│" + "│".join(f" {c.ljust(w)} " for c, w in zip(row, widths)) + "│" for row in rows)
    lines.append("└" + "┴".join("─" * (w + 2) for w in widths) + "┘")
    return "\n".join(lines) + "\n"
