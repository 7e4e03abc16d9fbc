"""The ``Selection`` that Monarch's ``monarch._rust_bindings.monarch_hyperactor.selection`` names:
a parsed selection expression over a mesh's dimensions (``"*, 0:4"``, ``"(*, 1) | (0, ?)"``).

Monarch's meshes take ``selection="all"`` or ``"choose"``; this object only parses and shows an
expression, with the structure and the text Monarch gives it: ``,`` descends a dimension, ``&`` and
``|`` intersect and join, ``*`` is every index, ``?`` any one, ``a:b:s`` a range and ``n`` one index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class _Range:
    start: int
    end: int | None
    step: int

    def __repr__(self) -> str:
        end = "None" if self.end is None else f"Some({self.end})"
        return f"Range({self.start}, {end}, {self.step})"


@dataclass(frozen=True)
class _Node:
    kind: str                       # "True", "False", "All", "Any", "Range", "Union", "Intersection"
    args: tuple[Union["_Node", _Range], ...] = ()

    def __repr__(self) -> str:
        return self.kind if not self.args else f"{self.kind}({', '.join(map(repr, self.args))})"


_TRUE = _Node("True")


def _nest(dim: _Node, tail: _Node) -> _Node:
    """``dim`` with ``tail`` in place of its innermost ``True``: the next dimension's selection."""
    if dim.kind == "True":
        return tail
    if dim.kind == "False":
        return dim
    if dim.kind == "Range":
        r, inner = dim.args
        assert isinstance(inner, _Node)
        return _Node("Range", (r, _nest(inner, tail)))
    return _Node(dim.kind, tuple(_nest(a, tail) for a in dim.args if isinstance(a, _Node)))


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = "".join(text.split())  # whitespace is ignored
        self.i = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"parse error: Failed to parse selection: {what} at {self.i} (input: {self.s!r})")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def number(self) -> int | None:
        j = self.i
        while self.i < len(self.s) and self.s[self.i].isdigit():
            self.i += 1
        return int(self.s[j:self.i]) if self.i > j else None

    def expression(self) -> _Node:
        node = self.intersection()
        while self.peek() == "|":
            self.i += 1
            node = _Node("Union", (node, self.intersection()))
        return node

    def intersection(self) -> _Node:
        node = self.chain()
        while self.peek() == "&":
            self.i += 1
            node = _Node("Intersection", (node, self.chain()))
        return node

    def chain(self) -> _Node:
        dims = [self.group()]
        while self.peek() == ",":
            self.i += 1
            dims.append(self.group())
        node = _TRUE
        for d in reversed(dims):
            node = _nest(d, node)
        return node

    def group(self) -> _Node:
        c = self.peek()
        if c == "(":
            self.i += 1
            node = self.expression()
            if self.peek() != ")":
                raise self.fail("expected ')'")
            self.i += 1
            return node
        if c == "*":
            self.i += 1
            return _Node("All", (_TRUE,))
        if c == "?":
            self.i += 1
            return _Node("Any", (_TRUE,))
        start = self.number()
        if self.peek() == ":":
            self.i += 1
            end = self.number()
            step = 1
            if self.peek() == ":":
                self.i += 1
                n = self.number()
                if n is None:
                    raise self.fail("expected a step")
                step = n
            return _Node("Range", (_Range(start or 0, end, step), _TRUE))
        if start is None:
            raise self.fail("expected a selection")
        return _Node("Range", (_Range(start, start + 1, 1), _TRUE))


class Selection:
    """A parsed selection expression (see the module)."""

    __slots__ = ("_node",)

    def __init__(self, node: _Node) -> None:
        self._node = node

    @classmethod
    def from_string(cls, s: str) -> "Selection":
        p = _Parser(s)
        node = p.expression()
        if p.i != len(p.s):
            raise p.fail("unexpected input")
        return cls(node)

    @classmethod
    def all(cls) -> "Selection":
        return cls(_Node("All", (_TRUE,)))

    @classmethod
    def any(cls) -> "Selection":
        return cls(_Node("Any", (_TRUE,)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selection) and self._node == other._node

    def __hash__(self) -> int:
        return hash(self._node)

    def __repr__(self) -> str:
        return repr(self._node)
