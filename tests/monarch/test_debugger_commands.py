"""Monarch's debugger command language and session table (monarch._src.actor.debugger, compatibility only)."""

import asyncio
import sys

import pytest

from monarch._src.actor.debugger.debug_command import Attach, Cast, Continue, DebugCommand, Help, ListCommand, Quit
from monarch._src.actor.debugger.debug_io import DebugIO
from monarch._src.actor.debugger.debug_session import DebugSession, DebugSessions


class _Recorder(DebugIO):
    def __init__(self) -> None:
        self.out: list[str] = []

    async def output(self, msg: str) -> None:
        self.out.append(msg)


def _parse(line: str):
    io = _Recorder()
    return asyncio.run(DebugCommand.parse(io, line)), io.out


@pytest.mark.parametrize("line, want", [
    ("a worker-7 3", Attach("worker-7", 3)),
    ("  attach w 0  ", Attach("w", 0)),
    ("l", ListCommand()), ("help", Help()), ("q", Quit()), ("continue", Continue()),
    ("cast w ranks(4) next", Cast("w", 4, "next")),
    ("cast w ranks(1, 5,9) p x + 1", Cast("w", [1, 5, 9], "p x + 1")),
    ("cast w ranks(2:) s", Cast("w", range(2, sys.maxsize), "s")),
    ("cast w ranks(::4) s", Cast("w", range(0, sys.maxsize, 4), "s")),
    ("cast w ranks(1:9:2) s", Cast("w", range(1, 9, 2), "s")),
    ("cast w ranks(x=1, y=(0,2), z=:3) bt", Cast("w", {"x": 1, "y": [0, 2], "z": range(0, 3)}, "bt")),
])
def test_a_well_formed_line_parses_to_its_command(line, want):
    assert _parse(line) == (want, [])


@pytest.mark.parametrize("line", [
    "", "attach", "a w", "a w 1 2", "a w x", "cast w ranks(1) ", "cast w ranks(1)) s", "cast w ranks(1,) s",
    "cast w ranks(1:2:3:4) s", "cast w ranks(1:2,3) s", "cast w ranks(x=) s", "cast w ranks(x=(1,2) s",
    "cast w rank(1) s", "castw ranks(1) s", "frobnicate",
])
def test_a_malformed_line_gives_none_and_one_error_line(line):
    cmd, out = _parse(line)
    assert cmd is None
    assert len(out) == 1 and out[0].startswith("Error parsing input: ") and out[0].endswith("\n")


def test_sessions_select_by_rank_list_range_and_coordinates():
    sessions = DebugSessions()
    made = [DebugSession(h * 2 + g, {"h": h, "g": g}, "host", "w") for h in range(3) for g in range(2)]
    for s in made:
        sessions.insert(s)
    sessions.insert(DebugSession(0, {"h": 0}, "host", "v"))
    assert len(sessions) == 7 and ("v", 0) in sessions and ("v", 1) not in sessions

    def ranks(sel):
        return sorted(s.rank for s in sessions.iter(sel))

    assert ranks(("w", 3)) == [3]
    assert ranks(("w", [0, 5])) == [0, 5]
    assert ranks(("w", range(1, 6, 2))) == [1, 3, 5]
    assert ranks(("w", None)) == list(range(6))
    assert ranks(("w", {"h": [0, 2], "g": 1})) == [1, 5]
    assert ranks(("w", {"missing": 0})) == []
    assert ranks(("nobody", None)) == []
    assert len(list(sessions.iter(None))) == 7
    assert [(i.actor_name, i.rank) for i in sessions.info()][:2] == [("v", 0), ("w", 0)]


def test_sessions_name_what_is_missing_or_already_there():
    sessions = DebugSessions()
    s = DebugSession(1, {}, "", "w")
    with pytest.raises(ValueError, match="^No debug sessions for actor w$"):
        sessions.get("w", 1)
    sessions.insert(s)
    with pytest.raises(ValueError, match="^Debug session for rank 1 already exists for actor w$"):
        sessions.insert(s)
    with pytest.raises(ValueError, match="^No debug session for rank 0 for actor w$"):
        sessions.remove("w", 0)
    assert sessions.remove("w", 1) is s and len(sessions) == 0
