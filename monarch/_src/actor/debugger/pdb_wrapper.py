"""Compatibility only: the actor side of Monarch's debugger actor (``DebugController``).

Where a program has made the job's ``debug_controller`` (``get_or_spawn_controller("debug_controller",
DebugController)``), ``breakpoint()`` in an actor runs a real :class:`pdb.Pdb` whose output is sent to
that actor, piece by piece as pdb writes it (with the function and line it stopped at), and whose
input is read from it, as Monarch's is; without one, ``monarch debug`` takes the breakpoint (README
'Debugging').  Every request blocks the actor's thread, as pdb blocks a program: the actor is stopped.
"""

from __future__ import annotations

import bdb
import inspect
import io
import linecache
import os
import pdb
import socket
import sys
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, Callable, Dict, Optional


@dataclass
class DebuggerWrite:
    """One piece of a session's traffic: bytes, and where the debugger stood when it wrote them (pdb's
    output; None for input sent to the actor)."""

    payload: bytes
    function: str | None
    lineno: int | None


def _ask(call: Callable[[], Any]) -> Any:
    # A debugger actor that cannot be reached ends the session as a quit would (the actor goes on).
    try:
        return call()
    except Exception as e:
        raise bdb.BdbQuit from e


class PdbWrapper(pdb.Pdb):
    """A pdb session of one rank of one actor, driven by the debugger actor ``controller``."""

    def __init__(self, rank: int, coords: Dict[str, int], actor_id: Any, controller: Any,
                 header: str | None = None) -> None:
        self.rank = rank
        self.coords = coords
        self.actor_id = actor_id
        self.controller = controller
        self.header = header
        # pdb's stdin/stdout given: it reads lines from them (no readline, no terminal).
        super().__init__(stdin=io.TextIOWrapper(io.BufferedReader(_Reader(self))), stdout=_Writer(self),
                         nosigint=True)

    @property
    def _name(self) -> str:
        return self.actor_id.actor_name

    def set_trace(self, frame: Optional[FrameType] = None) -> None:  # type: ignore[override]
        _ask(lambda: self.controller.debugger_session_start.call_one(
            self.rank, self.coords, socket.getfqdn(socket.gethostname()), self._name).get())
        if self.header:
            self.message(self.header)
        super().set_trace(frame)

    def do_clear(self, arg: str) -> Any:
        # Bare ``clear`` asks "Clear all breaks?" through input(), which is this process's terminal,
        # not the session: clear them all without asking.
        if not arg:
            self.clear_all_breaks()
            return None
        return super().do_clear(arg)

    def lookupmodule(self, filename: str) -> Optional[str]:
        # Code pickled by value from a file this host lacks: its text comes from the client (the
        # job's source loader), so ``b file:line`` and ``list`` work on it.
        found = super().lookupmodule(filename)
        if found is not None and not os.path.exists(found) and found not in linecache.cache:
            from monarch._src.actor.source_loader import load_remote_source

            try:
                text = load_remote_source(found)
            except Exception as e:
                self.error(f"Failed querying root client host for source code: {e}")
            else:
                if text:
                    linecache.cache[found] = (len(text), None, text.splitlines(keepends=True), found)
        return found

    def end_debug_session(self) -> None:
        """Tell the debugger actor this session is over; later output goes to this process's own."""
        _ask(lambda: self.controller.debugger_session_end.call_one(self._name, self.rank).get())
        self.stdin, self.stdout = sys.stdin, sys.stdout

    def post_mortem(self, exc_tb: TracebackType) -> None:  # type: ignore[override]
        """A session on the frames of ``exc_tb`` (what an endpoint raised)."""
        self.reset()
        self.interaction(None, exc_tb)


class _Reader(io.RawIOBase):
    """pdb's stdin: each read asks the debugger actor for the next bytes of input."""

    def __init__(self, session: PdbWrapper) -> None:
        self.session = session

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        s = self.session
        answer = _ask(lambda: s.controller.debugger_read.call_one(s._name, s.rank, len(b)).get())
        if answer == "detach":
            raise bdb.BdbQuit
        data = answer.payload[:len(b)]
        b[:len(data)] = data
        return len(data)


class _Writer:
    """pdb's stdout: each write goes to the debugger actor at once, with where pdb stands."""

    def __init__(self, session: PdbWrapper) -> None:
        self.session = session

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        s = self.session
        frame = getattr(s, "curframe", None)
        function = lineno = None
        if frame is not None:
            function = f"{inspect.getmodulename(frame.f_code.co_filename)}.{frame.f_code.co_name}"
            lineno = frame.f_lineno
        _ask(lambda: s.controller.debugger_write.call_one(
            s._name, s.rank, DebuggerWrite(text.encode(), function, lineno)).get())
        return len(text)

    def flush(self) -> None:
        pass
