"""Compatibility only: Monarch's ``SourceLoaderController``: an actor in the client that hands out the
text of a source file as the client has it (``linecache``: a file it can read, or a cell or ``exec``'d
code it registered there), so code pickled by value from a file a worker lacks can still be shown by
a debugger or traceback there.  Each function monarch pickles by value carries a
:class:`RemoteImportLoader` for its file as ``__loader__`` (``monarch_agents.wire.source_loader``),
which linecache asks for what it cannot read.
"""

from __future__ import annotations

import functools
import linecache

from monarch.actor import Actor, endpoint, get_or_spawn_controller


class SourceLoaderController(Actor):
    @endpoint
    def get_source(self, filename: str) -> str:
        return "".join(linecache.getlines(filename))


def source_loader_controller() -> SourceLoaderController:
    """The job's one source loader (spawned in the root client on first use)."""
    return get_or_spawn_controller("source_loader", SourceLoaderController).get()


@functools.lru_cache(maxsize=256)
def load_remote_source(filename: str) -> str:
    """``filename``'s text as the client's process has it ("" if it has none)."""
    return source_loader_controller().get_source.call_one(filename).get()


class RemoteImportLoader:
    """``__loader__`` of code pickled by value from ``filename``: in an actor, its text comes from the
    client; anywhere else (or if the client cannot say) linecache is told there is none."""

    def __init__(self, filename: str) -> None:
        self._filename = filename

    def get_source(self, _module_name: str) -> str:
        from monarch_agents.context import current

        if current().actor is None:
            raise ImportError(f"could not get source for {self._filename}: not in an actor")
        try:
            return load_remote_source(self._filename)
        except Exception as e:  # linecache takes only ImportError/OSError as "no source"
            raise ImportError(f"could not get source for {self._filename}: {e}") from None

    def __reduce__(self) -> tuple:
        return RemoteImportLoader, (self._filename,)
