"""Compatibility only: Monarch's debugger sessions: one per (actor name, rank) stopped at a breakpoint
in the debugger actor (``debug_controller``), relaying pdb's output and input, and their table,
selectable the way the ``cast`` command selects ranks (see ``debug_command``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from monarch._src.actor.debugger.debug_command import RanksType
from monarch._src.actor.debugger.debug_io import DebugIO


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
    """One rank of one actor stopped in the debugger actor (``DebugController``).

    The actor's pdb writes output and asks for input (``debugger_write``/``debugger_read``); whoever
    attaches (``attach``) sees that output and answers those reads, until it types ``detach`` or the
    actor's session ends.  What pdb wrote since the last input is kept, and shown again to whoever
    attaches next.  ``function``/``lineno`` say where pdb last stood.
    """

    def __init__(self, rank: int, coords: Dict[str, int], hostname: str, actor_name: str) -> None:
        self.rank = rank
        self.coords = coords
        self.hostname = hostname
        self.actor_name = actor_name
        self.function: Optional[str] = None
        self.lineno: Optional[int] = None
        self._events: Optional[asyncio.Queue] = None  # "read", "detach" or ("write", DebuggerWrite)
        self._input: Optional[asyncio.Queue] = None  # lines for the actor's pdb
        self._since_input: List[Any] = []
        # A read the actor is waiting on that a "detach" took before it was answered: the next attach
        # answers it first.
        self._read_owed = False
        self._attached = False

    def _queues(self) -> Tuple[asyncio.Queue, asyncio.Queue]:
        # Made on first use, on the debugger actor's loop.
        if self._events is None or self._input is None:
            self._events, self._input = asyncio.Queue(), asyncio.Queue()
        return self._events, self._input

    def get_info(self) -> DebugSessionInfo:
        return DebugSessionInfo(self.actor_name, self.rank, dict(self.coords), self.hostname,
                                self.function, self.lineno)

    def _label(self) -> str:
        return f"{self.actor_name} {self.rank} ({self.hostname})"

    async def attach(self, debug_io: DebugIO, line: Optional[str] = None, suppress_output: bool = False) -> None:
        """Relay between ``debug_io`` and the actor's pdb until ``detach`` (typed, or the session ended);
        with ``line``, send that one line and return once pdb took it (``cast``)."""
        self._attached = True
        try:
            if not suppress_output:
                await debug_io.output(f"Attached to debug session for {self._label()}\n")
            await self._relay(debug_io, line, suppress_output)
            if not suppress_output:
                await debug_io.output(f"Detached from debug session for {self._label()}\n")
        finally:
            self._attached = False

    async def _relay(self, debug_io: DebugIO, line: Optional[str], quiet: bool) -> None:
        events, to_actor = self._queues()
        if not quiet and self._since_input:
            await debug_io.output(f"<last pdb output for {self.actor_name} {self.rank} follows>\n")
            for w in self._since_input:
                await debug_io.output(w.payload.decode())
        while True:
            if self._read_owed:
                self._read_owed, event = False, "read"
            else:
                event = await events.get()
            if event == "detach":
                break
            if event == "read":
                once = line is not None
                try:
                    text = line if once else await debug_io.input()
                except BaseException:
                    self._read_owed = True  # still unanswered: the next attach answers it
                    raise
                if text == "detach":
                    self._read_owed = True
                    break
                await to_actor.put((text + "\n").encode())
                self._since_input = []
                line = None
                if once:
                    break
                continue
            _, write = event
            self._since_input.append(write)
            if not quiet:
                await debug_io.output(write.payload.decode())
        if not quiet:
            await debug_io.output(f"Detaching from debug session for {self._label()}\n")

    async def detach(self) -> None:
        """The actor's session ended: whoever is attached returns."""
        if self._attached:
            await self._queues()[0].put("detach")

    async def debugger_read(self, size: int) -> Any:
        """The actor's pdb waits for input: the next line typed (at most ``size`` bytes of it)."""
        from monarch._src.actor.debugger.pdb_wrapper import DebuggerWrite

        events, to_actor = self._queues()
        await events.put("read")
        data = await to_actor.get()
        return DebuggerWrite(data[:size], None, None)

    async def debugger_write(self, write: Any) -> None:
        """The actor's pdb wrote ``write``."""
        if write.function is not None and write.lineno is not None:
            self.function, self.lineno = write.function, write.lineno
        await self._queues()[0].put(("write", write))


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
