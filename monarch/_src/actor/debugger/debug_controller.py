"""Compatibility only: Monarch's debugger actor, ``DebugController``.

monarch's own debugger is ``monarch debug``: ``breakpoint()`` in any actor or rank registers with its
host agent's debug service (README 'Debugging').  A program that makes Monarch's debugger actor
itself (``debug_controller()``, or ``get_or_spawn_controller("debug_controller", DebugController)``
with this class or a subclass) gets Monarch's instead: from then on a ``breakpoint()`` in any of the
job's actors opens a session in this actor (``pdb_wrapper``), listed by ``list`` and driven from its
command loop (``attach NAME RANK``, ``cast NAME ranks(...) CMD``, ``continue``, ``quit``; see
``debug_command``) over its ``DebugIO`` (this process's terminal by default).  Unlike Monarch's, it
opens no TCP port for a debugger client: on a shared machine anyone could drive it; ``monarch
debug`` reaches ranks over the job's authenticated connections.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Tuple

from monarch.actor import Actor, concurrent_endpoint, endpoint, get_or_spawn_controller
from monarch._src.actor.debugger.debug_command import Attach, Cast, Continue, DebugCommand, Help, ListCommand, Quit
from monarch._src.actor.debugger.debug_command import RanksType
from monarch._src.actor.debugger.debug_io import DebugIO, DebugIOError, DebugStdIO
from monarch._src.actor.debugger.debug_session import DebugSession, DebugSessionInfo, DebugSessions
from monarch._src.actor.debugger.pdb_wrapper import DebuggerWrite

_NO_SERVER = ("the debugger actor opens no TCP port for a debugger client here (anyone on the machine could "
              "drive it): attach with `monarch debug`, or drive this actor's command loop (`enter`)")

_HELP = """monarch_dbg commands:
\tattach <actor_name> <rank> - attach to a debug session
\tlist - list all debug sessions
\tquit - exit the debugger, leaving all sessions in place
\tcast <actor_name> ranks(...) <command> - send a command to a set of ranks on the specified actor mesh.
\t\tThe value inside ranks(...) can be a single rank (ranks(1)),
\t\ta list of ranks (ranks(1,4,6)), a range of ranks (ranks(start?:stop?:step?)),
\t\tor a dict of dimensions (ranks(dim1=1:5:2,dim2=3, dim4=(3,6))).
\tcontinue - clear all breakpoints and tell all ranks to continue
\thelp - print this help message
"""


def _grid(headers: List[str], rows: List[Tuple[Any, ...]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule]
    for n, row in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        lines.append(rule.replace("-", "=") if n == 0 else rule)
    return "\n".join(lines)


class DebugController(Actor):
    """The job's debugger actor: one session per (actor name, rank) stopped at a breakpoint."""

    def __init__(self) -> None:
        self.sessions = DebugSessions()
        self._task_lock = asyncio.Lock()
        self._task: Optional[asyncio.Task] = None
        self._debug_io: DebugIO = DebugStdIO()

    @property
    def _server(self) -> "asyncio.Future[Any]":
        """Monarch's TCP server for debugger clients; here a future that fails saying why there is none."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        fut.set_exception(NotImplementedError(_NO_SERVER))
        return fut

    @concurrent_endpoint
    async def wait_pending_session(self) -> None:
        """Returns once some actor is stopped in this debugger."""
        while len(self.sessions) == 0:
            await asyncio.sleep(0.2)

    @endpoint
    async def list(self, print_output: bool = True) -> List[DebugSessionInfo]:
        infos = sorted(self.sessions.info())
        if print_output:
            await self._print_list(infos)
        return infos

    async def _print_list(self, infos: List[DebugSessionInfo]) -> None:
        rows = [(i.actor_name, i.rank, i.coords, i.hostname, i.function, i.lineno) for i in infos]
        await self._debug_io.output(_grid(["Actor Name", "Rank", "Coords", "Hostname", "Function", "Line No."],
                                          rows) + "\n")

    @endpoint
    async def enter(self) -> None:
        """Run the command loop over this actor's ``DebugIO`` until ``quit``."""
        async with self._task_lock:
            await self._enter()

    async def _enter(self) -> None:
        io = self._debug_io
        await io.output("\n\n************************ MONARCH DEBUGGER ************************\n")
        await io.output("Enter 'help' for a list of commands.\n")
        await io.output("Enter 'list' to show all active breakpoints.\n\n")
        while True:
            try:
                line = await io.input("monarch_dbg> ")
            except Exception as e:  # nothing more can be read: a loop that asks again would spin
                raise DebugIOError() from e
            try:
                if not line.strip():
                    continue
                command = await DebugCommand.parse(io, line)
                if isinstance(command, Help):
                    await io.output(_HELP)
                elif isinstance(command, Attach):
                    await self.sessions.get(command.actor_name, command.rank).attach(io)
                elif isinstance(command, ListCommand):
                    await self._print_list(sorted(self.sessions.info()))
                elif isinstance(command, Continue):
                    await self._cast_input_and_wait("clear")
                    await self._cast_input_and_wait("c")
                elif isinstance(command, Quit):
                    await io.quit()
                    return
                elif isinstance(command, Cast):
                    await self._cast_input_and_wait(command.command, (command.actor_name, command.ranks))
            except (DebugIOError, asyncio.CancelledError):
                raise
            except Exception as e:
                await io.output(f"Error processing command: {e}\n")

    async def _cast_input_and_wait(self, command: str,
                                   selection: Optional[Tuple[str, Optional[RanksType]]] = None) -> None:
        """Send ``command`` to each selected session (every one by default); returns once each took it."""
        await asyncio.gather(*(s.attach(self._debug_io, command, suppress_output=True)
                               for s in list(self.sessions.iter(selection))))

    # -- what the actors' pdb sessions call (pdb_wrapper) --

    @concurrent_endpoint
    async def debugger_session_start(self, rank: int, coords: Dict[str, int], hostname: str,
                                     actor_name: str) -> None:
        if (actor_name, rank) not in self.sessions:
            self.sessions.insert(DebugSession(rank, coords, hostname, actor_name))

    @concurrent_endpoint
    async def debugger_session_end(self, actor_name: str, rank: int) -> None:
        await self.sessions.remove(actor_name, rank).detach()

    @concurrent_endpoint
    async def debugger_read(self, actor_name: str, rank: int, size: int) -> "DebuggerWrite | str":
        return await self.sessions.get(actor_name, rank).debugger_read(size)

    @concurrent_endpoint
    async def debugger_write(self, actor_name: str, rank: int, write: DebuggerWrite) -> None:
        await self.sessions.get(actor_name, rank).debugger_write(write)


_controller: Optional[DebugController] = None


def debug_controller() -> DebugController:
    """The job's debugger actor, spawned in the root client on first use (as Monarch's); from then on a
    ``breakpoint()`` in an actor stops in it instead of ``monarch debug``."""
    global _controller
    if _controller is None:
        _controller = get_or_spawn_controller("debug_controller", DebugController).get()
    return _controller
