"""Help drawn with Rich, as readable as Typer's panels, paid for only when help is asked for.

Click builds help through a ``HelpFormatter``; this one only collects what Click hands it (usage,
text, option and command lists) and draws it with Rich in ``getvalue()``, so Rich is imported
when ``--help`` runs and never by a command that does its work.
"""

from __future__ import annotations

import io
import os
import sys
from contextlib import contextmanager
from typing import Iterator, Sequence

import click


class RichHelpFormatter(click.HelpFormatter):
    def __init__(self, indent_increment: int = 2, width: int | None = None, max_width: int | None = None):
        super().__init__(indent_increment, width, max_width)
        self._usage = ""
        self._blocks: list[tuple[str, str, object]] = []  # ("text", "", str) | ("list", heading, rows)
        self._heading = ""

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        self._usage = f"{prog} {args}".strip()

    def write_heading(self, heading: str) -> None:
        self._heading = heading

    def write_paragraph(self) -> None:
        pass

    def write_text(self, text: str) -> None:
        self._blocks.append(("text", self._heading, text))

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        self._blocks.append(("list", self._heading, list(rows)))

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        old, self._heading = self._heading, name
        try:
            yield
        finally:
            self._heading = old

    def getvalue(self) -> str:
        from rich import box
        from rich.console import Console
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        buf = io.StringIO()
        tty = sys.stdout.isatty()
        console = Console(file=buf, force_terminal=tty, no_color=bool(os.environ.get("NO_COLOR")) or not tty,
                          width=min(self.width or 100, 100), highlight=False)
        if self._usage:
            console.print(Text.assemble(("Usage: ", "yellow"), (self._usage, "bold")))
            console.print()
        blocks = []
        for kind, heading, body in self._blocks:
            # An epilog of several "\b" sections (exit codes, the agents' quick start): one panel each.
            if kind == "text" and str(body).startswith("\b\n") and "\n\n\b\n" in str(body):
                blocks.extend(("text", heading, "\b\n" + part.removeprefix("\b\n"))
                              for part in str(body).split("\n\n\b\n"))
            else:
                blocks.append((kind, heading, body))
        for kind, heading, body in blocks:
            if kind == "text":
                text = str(body)
                if text.startswith("\b\n"):  # "Title:" then rows "term  description", kept as rows
                    title, _, rest = text[2:].partition("\n")
                    heading = title.rstrip(":")
                    body = [_row(line) for line in rest.splitlines() if line.strip()]
                else:
                    # Docstring paragraphs: lines joined, Rich wraps them to the terminal.
                    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
                    console.print(Text("\n\n".join(paragraphs)))
                    console.print()
                    continue
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold cyan", no_wrap=True)
            grid.add_column()
            for term, desc in body:  # type: ignore[union-attr]
                grid.add_row(term, desc)
            console.print(Panel(grid, title=heading or "Options", title_align="left", box=box.ROUNDED,
                                border_style="dim"))
        return buf.getvalue()


#: What `monarch --help` ends with: the shortest path an agent needs (the guide has the rest).
QUICK_START = """\b
Quick start for agents (`monarch guide` prints the full guide):
  monarch apply myjob.job          # reserve myjob.py's job = ProcessJob({"hosts": 2})
  monarch exec -- python train.py  # rank 0; --all, --point hosts=1, --mesh NAME
  monarch run -- python train.py   # every host, torchrun's environment (torchrun ... works too)
  monarch logs                     # the last run's output again
  monarch query 'SHOW TABLES'      # telemetry as SQL
  monarch debug list               # ranks waiting in pdb; `monarch debug` attaches
  monarch kill                     # release"""


def _row(line: str) -> tuple[str, str]:
    """'term   description' (a '# ' before the description, as in a shell comment, is dropped)."""
    term, _, desc = line.strip().partition("  ")
    return term, desc.strip().removeprefix("# ")


class RichContext(click.Context):
    formatter_class = RichHelpFormatter
