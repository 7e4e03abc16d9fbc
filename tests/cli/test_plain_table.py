"""`monarch query`'s table without Rich's layout (monarch_cli.output.plain_table) is Rich's table, to the byte.

Random tables (markup characters, spaces, emoji codes, empty cells, no rows, narrow consoles) are
drawn both ways; wherever the plain drawing takes a table it must equal what `rich.table.Table`
prints to a console that is not a terminal, and it must leave to Rich what it cannot draw alike.
"""

from __future__ import annotations

import io
import random

import pytest

from monarch_cli import output
from monarch_cli.output import plain_table


def _rich(columns: list[str], rows: list[list[str]]) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    f = io.StringIO()
    t = Table(*columns, show_lines=False)
    for r in rows:
        t.add_row(*(escape(c) for c in r))
    # As monarch_cli.output's `out`, writing to a file (not a terminal).
    Console(file=f, highlight=False, soft_wrap=True).print(t)
    return f.getvalue()


@pytest.fixture
def not_a_terminal(monkeypatch):
    monkeypatch.setattr(output, "rich_would_style", lambda fd: False)


_CHARS = "abcXYZ 019_-.:[]\\/'\"=+*#@!~`{}()<>,;?$%^&|"


def test_random_tables_are_drawn_as_rich_draws_them(not_a_terminal, monkeypatch):
    rng = random.Random(28)
    drawn = 0
    for _ in range(1500):
        n = rng.randint(1, 6)
        columns = ["".join(rng.choice(_CHARS) for _ in range(rng.randint(1, 6))) for _ in range(n)]
        rows = [["".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 14))) for _ in range(n)]
                for _ in range(rng.choice([0, 1, 2, 5]))]
        if rng.random() < 0.2:
            rows = [[":smile:" if rng.random() < 0.3 else c for c in r] for r in rows]
        monkeypatch.setenv("COLUMNS", str(rng.choice([40, 80, 120])))
        plain = plain_table(columns, rows)
        if plain is not None:
            drawn += 1
            assert plain == _rich(columns, rows), (columns, rows)
    assert drawn > 300  # most tables are drawn without Rich


def test_a_query_answer_is_drawn_as_rich_draws_it(not_a_terminal, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    rows = [[f"host{i}", str(i % 3), "0", "", "2026-11-25 01:42:27.123456"] for i in range(256)]
    columns = ["host", "n", "lo", "hi", "started"]
    assert plain_table(columns, rows) == _rich(columns, rows)


@pytest.mark.parametrize("columns, rows", [
    (["a[b]"], [["x"]]),  # markup in a header
    (["a"], [[":smile:"]]),  # an emoji code Rich replaces
    (["a"], [["é"]]), (["a"], [["a\tb"]]), (["a"], [["a\\[b"]]),  # not plain ASCII; a tab; a backslash
    (["a", "b"], [["x"]]),  # a row shorter than the header (duplicate column names)
    (["a"], [["x" * 200]]),  # wider than the console: Rich wraps
])
def test_what_it_leaves_to_rich(not_a_terminal, monkeypatch, columns, rows):
    monkeypatch.setenv("COLUMNS", "80")
    assert plain_table(columns, rows) is None


def test_a_terminal_or_forced_colour_is_richs(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert output.rich_would_style(1) and plain_table(["a"], [["x"]]) is None
