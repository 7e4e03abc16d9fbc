"""`monarch serve` progress on a stderr that is no terminal: plain lines, at most one a second, and the last one."""

from __future__ import annotations

import time

from monarch_cli.commands.serve import _ProgressLines


def test_progress_lines_are_throttled_and_the_last_one_is_shown(capsys):
    lines = _ProgressLines(time.monotonic())
    lines.show("host agents ready 0/256")
    lines.show("host agents ready 3/256")  # within a second of the last line: not shown
    lines.show("host agents ready 256/256", final=True)
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(" (")[0] for ln in err] == ["host agents ready 0/256", "host agents ready 256/256"]
    assert all(ln.endswith(" s)") for ln in err)


def test_ready_at_the_first_look_prints_no_progress_line(capsys):
    _ProgressLines(time.monotonic()).show("host agents ready 2/2", final=True)
    assert capsys.readouterr().err == ""
