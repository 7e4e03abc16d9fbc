"""Compatibility only: Monarch's debugger IO interface (``DebugIO``) and its terminal implementation."""

from __future__ import annotations

import asyncio
import sys


class DebugIO:
    """Where a debugger reads commands from and writes its output to (async, so a client never blocks a loop)."""

    async def input(self, prompt: str = "") -> str:
        raise NotImplementedError

    async def output(self, msg: str) -> None:
        raise NotImplementedError

    async def quit(self) -> None:
        raise NotImplementedError


class DebugStdIO(DebugIO):
    """This process's terminal: ``input`` runs in a worker thread so the event loop keeps serving."""

    async def input(self, prompt: str = "") -> str:
        return await asyncio.to_thread(input, prompt)

    async def output(self, msg: str) -> None:
        # msg carries its own newlines (pdb's output is passed through as written).
        sys.stdout.write(msg)
        sys.stdout.flush()

    async def quit(self) -> None:
        pass


class DebugIOError(RuntimeError):
    """The debugger's reader or writer went away (a closed terminal or client connection)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or ("debugger IO closed",)))  # args: so that it pickles back
