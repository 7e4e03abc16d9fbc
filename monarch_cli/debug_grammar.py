"""The ``monarch_dbg>`` command language, as PyTorch Monarch's debugger spells it.

    help | h                              this list
    list | l                              the sessions
    attach <id> | attach <name> <rank>    a pdb session (``a`` for short)
    cast [<name>] ranks(<sel>) <pdb cmd>  one pdb command on several ranks
    continue | c                          every session continues (breakpoints cleared)
    quit | q                              leave; sessions stay where they are

``<sel>``: ``N``; ``N,M,...``; ``start:stop:step`` (each part optional); or dimensions,
``gpus=0:2, hosts=(0,1)``.  A line that is none of these is an error that starts with
"Error parsing input:", as Monarch's does.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Union

RankSel = Union[int, list, range, dict]


class ParseError(ValueError):
    """The line is not a debugger command; ``str()`` is the one line to show."""

    def __init__(self, detail: str):
        super().__init__(f"Error parsing input: {detail}")


@dataclass
class Help:
    pass


@dataclass
class ListSessions:
    pass


@dataclass
class Attach:
    id: int | None = None
    name: str = ""
    rank: int = 0


@dataclass
class Cast:
    name: str
    ranks: RankSel
    command: str


@dataclass
class Continue:
    pass


@dataclass
class Quit:
    pass


Command = Union[Help, ListSessions, Attach, Cast, Continue, Quit]

_NAME = re.compile(r"[-_a-zA-Z0-9.]+\Z")
_INT = re.compile(r"-?\d+\Z")


def parse(line: str) -> Command:
    """One ``monarch_dbg>`` line as a command; raises ParseError."""
    text = line.strip()
    if not text:
        raise ParseError("empty command")
    word, _, rest = text.partition(" ")
    rest = rest.strip()
    if word in ("h", "help", "?"):
        return _alone(Help(), word, rest)
    if word in ("l", "list"):
        return _alone(ListSessions(), word, rest)
    if word in ("c", "continue"):
        return _alone(Continue(), word, rest)
    if word in ("q", "quit", "exit"):
        return _alone(Quit(), word, rest)
    if word in ("a", "attach"):
        return _attach(rest)
    if word == "cast" or word.startswith("cast"):
        if word != "cast":
            raise ParseError(f"unknown command {word!r} (try 'help')")
        return _cast(rest)
    raise ParseError(f"unknown command {word!r} (try 'help')")


def _alone(cmd: Command, word: str, rest: str) -> Command:
    if rest:
        raise ParseError(f"'{word}' takes no arguments, got {rest!r}")
    return cmd


def _attach(rest: str) -> Attach:
    parts = rest.split()
    if len(parts) == 1 and _INT.match(parts[0]):
        return Attach(id=int(parts[0]))
    if len(parts) == 2 and _NAME.match(parts[0]) and _INT.match(parts[1]):
        return Attach(name=parts[0], rank=int(parts[1]))
    raise ParseError(f"expected 'attach <id>' or 'attach <actor> <rank>', got {('attach ' + rest).strip()!r}")


def _cast(rest: str) -> Cast:
    name = ""
    if not rest.startswith("ranks("):
        name, _, rest = rest.partition(" ")
        rest = rest.lstrip()
        if not _NAME.match(name) or not rest.startswith("ranks("):
            raise ParseError("expected 'cast [<actor>] ranks(...) <pdb command>'")
    # A dimension may hold a parenthesized list: ranks(gpus=(0,1), hosts=0).
    depth, i = 0, len("ranks(")
    close = -1
    while i < len(rest):
        ch = rest[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                close = i
                break
            depth -= 1
        i += 1
    if close < 0:
        raise ParseError("unclosed 'ranks('")
    sel = parse_ranks(rest[len("ranks("):close])
    command = rest[close + 1:].strip()
    if not command:
        raise ParseError("cast needs a pdb command after ranks(...)")
    return Cast(name, sel, command)


def parse_ranks(text: str) -> RankSel:
    """The inside of ``ranks(...)``."""
    t = text.strip()
    if not t:
        raise ParseError("ranks() is empty")
    if "=" in t:
        dims: dict = {}
        for part in _split_top(t):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not re.match(r"[A-Za-z_]\w*\Z", key):
                raise ParseError(f"bad dimension {part.strip()!r} in ranks(...)")
            if value.startswith("(") and value.endswith(")"):
                dims[key] = _int_list(value[1:-1])
            else:
                dims[key] = _one_or_range(value)
        return dims
    if "," in t:
        return _int_list(t)
    return _one_or_range(t)


def _split_top(t: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in t:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def _int_list(t: str) -> list:
    items = [x.strip() for x in t.split(",")]
    if not all(_INT.match(x) for x in items):
        raise ParseError(f"expected ranks like 1,4,6, got {t.strip()!r}")
    return [int(x) for x in items]


def _one_or_range(t: str) -> int | range:
    t = t.strip()
    if _INT.match(t):
        return int(t)
    if ":" in t:
        parts = [p.strip() for p in t.split(":")]
        if len(parts) > 3 or not all(p == "" or _INT.match(p) for p in parts):
            raise ParseError(f"expected start:stop:step, got {t!r}")
        start = int(parts[0]) if parts[0] else 0
        stop = int(parts[1]) if parts[1] else sys.maxsize
        step = int(parts[2]) if len(parts) > 2 and parts[2] else 1
        if step == 0:
            raise ParseError("a range step cannot be 0")
        return range(start, stop, step)
    raise ParseError(f"expected a rank, a list or a range in ranks(...), got {t!r}")


def selects(sel: RankSel, rank: int, coords: dict) -> bool:
    """Whether a session of ``rank`` (at ``coords``) is in the selection."""
    if isinstance(sel, int):
        return rank == sel
    if isinstance(sel, (list, range)):
        return rank in sel
    for dim, want in sel.items():
        if dim not in coords:
            return False
        v = coords[dim]
        if isinstance(want, int) and v != want:
            return False
        if isinstance(want, (list, range)) and v not in want:
            return False
    return True


HELP = """monarch_dbg commands:
  list                               list every debug session (id, rank, host, where)
  attach <id> | attach <actor> <rank>
                                     a pdb session on that rank; 'detach' (or Ctrl-D when piped) returns here
  cast [<actor>] ranks(...) <cmd>    send one pdb command to several ranks; answers are labelled by rank.
                                     ranks(1), ranks(1,4,6), ranks(start?:stop?:step?),
                                     or dimensions: ranks(gpus=1:5:2, hosts=(0,1))
  continue                           clear breakpoints and let every session continue
  quit                               leave the debugger; sessions stay where they are
  help                               this message
"""
