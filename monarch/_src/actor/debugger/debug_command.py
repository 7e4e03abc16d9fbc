"""Compatibility only: Monarch's debugger command language, parsed by ``DebugCommand.parse``.

Commands: ``attach|a NAME RANK``, ``list|l``, ``help|h``, ``quit|q``, ``continue|c`` and
``cast NAME ranks(SEL) PDB_COMMAND``, where SEL is a rank (``3``), a list of two or more (``1,4,7``),
a slice ``start:stop[:step]`` (each part optional; missing stop means "to the end"), or per-dimension
selectors ``dim=VALUE, ...`` whose VALUE is a rank, a parenthesised list or a slice.  A line that does
not parse writes one error line to the debugger's IO and gives None.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Union

from monarch._src.actor.debugger.debug_io import DebugIO

RanksType = Union[int, List[int], range, Dict[str, Union[range, List[int], int]]]

_NAME = r"[A-Za-z0-9_\-]+"
_ATTACH = re.compile(rf"(?:attach|a)\s+({_NAME})\s+(\d+)")
_CAST = re.compile(rf"cast\s+({_NAME})\s+ranks\((.*?)\)\s+(\S.*)", re.DOTALL)
_SIMPLE = {"list": "list", "l": "list", "help": "help", "h": "help",
           "quit": "quit", "q": "quit", "continue": "continue", "c": "continue"}


class _ParseError(ValueError):
    pass


class _Selector:
    """A small recursive-descent reader of the text inside ``ranks(...)``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _peek(self) -> str:
        self._ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _expect(self, ch: str) -> None:
        if self._peek() != ch:
            raise _ParseError(f"expected {ch!r} at column {self.pos} of {self.text!r}")
        self.pos += 1

    def _int(self) -> Optional[int]:
        self._ws()
        m = re.compile(r"\d+").match(self.text, self.pos)
        if m is None:
            return None
        self.pos = m.end()
        return int(m.group())

    def _value(self, top: bool) -> Union[int, List[int], range]:
        """A rank, a slice, or (``top``: bare; in a dimension: parenthesised) a list of ranks."""
        if not top and self._peek() == "(":
            self.pos += 1
            items = self._int_list()
            self._expect(")")
            return items
        start = self._int()
        if self._peek() != ":":
            if start is None:
                raise _ParseError(f"expected a rank at column {self.pos} of {self.text!r}")
            if top and self._peek() == ",":
                self.pos += 1
                return [start, *self._int_list()]
            return start
        self.pos += 1
        stop = self._int()
        step = None
        if self._peek() == ":":
            self.pos += 1
            step = self._int()
        return range(0 if start is None else start, sys.maxsize if stop is None else stop,
                     1 if step is None else step)

    def _int_list(self) -> List[int]:
        items = []
        while True:
            n = self._int()
            if n is None:
                raise _ParseError(f"expected a rank at column {self.pos} of {self.text!r}")
            items.append(n)
            if self._peek() != ",":
                return items
            self.pos += 1

    def parse(self) -> RanksType:
        self._ws()
        m = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=").match(self.text, self.pos)
        if m is None:
            result: RanksType = self._value(top=True)
        else:
            dims: Dict[str, Union[range, List[int], int]] = {}
            while True:
                m = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=").match(self.text, self.pos)
                if m is None:
                    raise _ParseError(f"expected dim=VALUE at column {self.pos} of {self.text!r}")
                self.pos = m.end()
                dims[m.group(1)] = self._value(top=False)
                if self._peek() != ",":
                    break
                self.pos += 1
            result = dims
        if self._peek():
            raise _ParseError(f"unexpected {self.text[self.pos:]!r} in ranks({self.text})")
        return result


class DebugCommand:
    """One line a user typed at the debugger prompt, parsed."""

    @staticmethod
    async def parse(debug_io: DebugIO, line: str) -> Union["DebugCommand", None]:
        try:
            return _parse(line.strip())
        except _ParseError as e:
            await debug_io.output(f"Error parsing input: {e}\n")
            return None


def _parse(line: str) -> DebugCommand:
    if line in _SIMPLE:
        return {"list": ListCommand, "help": Help, "quit": Quit, "continue": Continue}[_SIMPLE[line]]()
    m = _ATTACH.fullmatch(line)
    if m:
        return Attach(m.group(1), int(m.group(2)))
    m = _CAST.fullmatch(line)
    if m:
        # The selector ends at the first ')' that closes 'ranks(' (a nested dim list has its own
        # parentheses), so find the balanced close rather than the regex's lazy one.
        head = line.index("ranks(") + len("ranks(")
        depth, i = 1, head
        while i < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[i], 0)
            i += 1
        if depth:
            raise _ParseError(f"unclosed 'ranks(' in {line!r}")
        rest = line[i:]
        if not rest[:1].isspace() or not rest.strip():
            raise _ParseError(f"expected a pdb command after ranks(...) in {line!r}")
        return Cast(m.group(1), _Selector(line[head:i - 1]).parse(), rest.strip())
    raise _ParseError(f"unknown command {line!r} (try 'help')" if line else "empty command (try 'help')")


@dataclass
class Attach(DebugCommand):
    actor_name: str
    rank: int


@dataclass
class ListCommand(DebugCommand):
    pass


@dataclass
class Quit(DebugCommand):
    pass


@dataclass
class Help(DebugCommand):
    pass


@dataclass
class Continue(DebugCommand):
    pass


@dataclass
class Cast(DebugCommand):
    actor_name: str
    ranks: RanksType
    command: str
