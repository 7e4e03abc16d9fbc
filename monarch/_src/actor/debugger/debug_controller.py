"""Compatibility only: Monarch's ``DebugController`` name.

Monarch routes every actor's ``breakpoint()`` to one controller actor on the client; monarch routes it to
the host agent's debug service and ``monarch debug`` attaches to it (README 'Debugging'), so no session
ever registers here.  The class exists so that programs which subclass it or list its sessions import and
run; entering it says where monarch's debugger is.
"""

from __future__ import annotations

from typing import List

from monarch.actor import Actor, endpoint
from monarch._src.actor.debugger.debug_io import DebugIO, DebugStdIO
from monarch._src.actor.debugger.debug_session import DebugSessionInfo, DebugSessions

_WHERE = ("monarch's debugger is the `monarch debug` command (breakpoint() in an actor registers with its "
          "host agent); see README 'Debugging'")


class DebugController(Actor):
    """A table of debug sessions (always empty under monarch, see the module docstring)."""

    def __init__(self) -> None:
        self.sessions = DebugSessions()
        self._debug_io: DebugIO = DebugStdIO()

    @endpoint
    async def list(self, print_output: bool = True) -> List[DebugSessionInfo]:
        infos = self.sessions.info()
        if print_output:
            for info in infos:
                await self._debug_io.output(f"{info.actor_name} rank {info.rank} {info.coords} "
                                            f"{info.hostname} {info.function}:{info.lineno}\n")
        return infos

    @endpoint
    async def enter(self) -> None:
        raise NotImplementedError(_WHERE)


def debug_controller() -> DebugController:
    """Monarch's client-side debugger actor; monarch has none (see the module docstring)."""
    raise NotImplementedError(_WHERE)
