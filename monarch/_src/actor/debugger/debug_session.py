"""Compatibility only: Monarch's debugger session table: one session per (actor name, rank) stopped at
a breakpoint, selectable the way the ``cast`` command selects ranks (see ``debug_command``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple, Union

from monarch._src.actor.debugger.debug_command import RanksType


@dataclass
class DebugSessionInfo:
    """What ``list`` shows of one session; sessions sort by actor name, then rank."""

    actor_name: str
    rank: int
    coords: Dict[str, int]
    hostname: str
    function: str | None
    lineno: int | None

    def __lt__(self, other: "DebugSessionInfo") -> bool:
        return (self.actor_name, self.rank) < (other.actor_name, other.rank)


class DebugSession:
    """One rank of one actor stopped in the debugger; ``function``/``lineno`` say where, once known."""

    def __init__(self, rank: int, coords: Dict[str, int], hostname: str, actor_name: str) -> None:
        self.rank = rank
        self.coords = coords
        self.hostname = hostname
        self.actor_name = actor_name
        self.function: Optional[str] = None
        self.lineno: Optional[int] = None

    def get_info(self) -> DebugSessionInfo:
        return DebugSessionInfo(self.actor_name, self.rank, dict(self.coords), self.hostname,
                                self.function, self.lineno)


def _selects(value: Union[int, List[int], range], n: int) -> bool:
    return n == value if isinstance(value, int) else n in value


class DebugSessions:
    """The sessions by actor name and rank; ``insert``/``get``/``remove`` raise ValueError naming what is
    missing or already there."""

    def __init__(self) -> None:
        self._by_actor: Dict[str, Dict[int, DebugSession]] = {}

    def insert(self, session: DebugSession) -> None:
        ranks = self._by_actor.setdefault(session.actor_name, {})
        if session.rank in ranks:
            raise ValueError(f"Debug session for rank {session.rank} already exists for actor {session.actor_name}")
        ranks[session.rank] = session

    def _ranks(self, actor_name: str, rank: int) -> Dict[int, DebugSession]:
        ranks = self._by_actor.get(actor_name)
        if not ranks:
            raise ValueError(f"No debug sessions for actor {actor_name}")
        if rank not in ranks:
            raise ValueError(f"No debug session for rank {rank} for actor {actor_name}")
        return ranks

    def get(self, actor_name: str, rank: int) -> DebugSession:
        return self._ranks(actor_name, rank)[rank]

    def remove(self, actor_name: str, rank: int) -> DebugSession:
        ranks = self._ranks(actor_name, rank)
        session = ranks.pop(rank)
        if not ranks:
            del self._by_actor[actor_name]
        return session

    def iter(self, selection: Optional[Tuple[str, Optional[RanksType]]]) -> Iterator[DebugSession]:
        """Every session (``None``), or an actor's sessions whose rank (int, list, range; None: all) or
        coordinates (``{dim: int | list | range}``, every dim present and selected) match."""
        if selection is None:
            for ranks in self._by_actor.values():
                yield from ranks.values()
            return
        actor_name, sel = selection
        for session in self._by_actor.get(actor_name, {}).values():
            if sel is None:
                yield session
            elif isinstance(sel, dict):
                if all(dim in session.coords and _selects(v, session.coords[dim]) for dim, v in sel.items()):
                    yield session
            elif _selects(sel, session.rank):
                yield session

    def info(self) -> List[DebugSessionInfo]:
        return sorted(s.get_info() for ranks in self._by_actor.values() for s in ranks.values())

    def __len__(self) -> int:
        return sum(len(ranks) for ranks in self._by_actor.values())

    def __contains__(self, item: Tuple[str, int]) -> bool:
        actor_name, rank = item
        return rank in self._by_actor.get(actor_name, {})
