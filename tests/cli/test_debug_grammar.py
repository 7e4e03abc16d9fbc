"""The monarch_dbg> command language (PyTorch Monarch's grammar, plus `attach <id>`)."""

import sys

import pytest

from monarch_cli import debug_grammar as g


@pytest.mark.parametrize("line,expected", [
    ("help", g.Help()), ("h", g.Help()), ("list", g.ListSessions()), ("l", g.ListSessions()),
    ("continue", g.Continue()), ("c", g.Continue()), ("quit", g.Quit()), ("q", g.Quit()),
    ("attach 0", g.Attach(id=0)), ("a 12", g.Attach(id=12)), ("attach trainers 3", g.Attach(name="trainers", rank=3)),
    ("attach train.py 1", g.Attach(name="train.py", rank=1)),
    ("cast ranks(2) p loss", g.Cast("", 2, "p loss")),
    ("cast ranks(2,3) p loss", g.Cast("", [2, 3], "p loss")),
    ("cast ranks(1:5:2) n", g.Cast("", range(1, 5, 2), "n")),
    ("cast ranks(:3) w", g.Cast("", range(0, 3), "w")),
    ("cast ranks(2:) w", g.Cast("", range(2, sys.maxsize), "w")),
    ("cast trainers ranks(0,1) p self.loss", g.Cast("trainers", [0, 1], "p self.loss")),
    ("cast trainers ranks(gpus=1:3, hosts=(0,1)) p x", g.Cast("trainers", {"gpus": range(1, 3), "hosts": [0, 1]}, "p x")),
    ("cast ranks(0)   !print((1, 2))", g.Cast("", 0, "!print((1, 2))")),
])
def test_parses(line, expected):
    assert g.parse(line) == expected


@pytest.mark.parametrize("line,detail", [
    ("bogus", "unknown command 'bogus'"),
    ("attach", "expected 'attach <id>'"),
    ("attach x", "expected 'attach <id>'"),
    ("attach 1 2 3", "expected 'attach <id>'"),
    ("list 3", "'list' takes no arguments"),
    ("cast p loss", "expected 'cast [<actor>] ranks(...)"),
    ("cast ranks(1,2 p loss", "unclosed 'ranks('"),
    ("cast ranks() p", "ranks() is empty"),
    ("cast ranks(1:2:0) p", "step cannot be 0"),
    ("cast ranks(a,b) p", "expected ranks like 1,4,6"),
    ("cast ranks(1)", "cast needs a pdb command"),
    ("cast ranks(x) p", "expected a rank, a list or a range"),
])
def test_errors_are_one_line(line, detail):
    with pytest.raises(g.ParseError) as e:
        g.parse(line)
    assert str(e.value).startswith("Error parsing input: ")
    assert detail in str(e.value)
    assert "\n" not in str(e.value)


def test_selection_by_rank_and_by_dimension():
    assert g.selects([1, 3], 3, {}) and not g.selects([1, 3], 2, {})
    assert g.selects(range(0, 10, 2), 4, {}) and not g.selects(range(0, 10, 2), 5, {})
    assert g.selects({"gpus": range(1, 3)}, 0, {"gpus": 2}) and not g.selects({"gpus": 0}, 0, {"gpus": 1})
    assert not g.selects({"hosts": 0}, 0, {"gpus": 0})  # a session without that dimension
