"""Compatibility only: Monarch's ``SourceLoaderController``: an actor in the client that hands out the
text of a source file it can read, so code pickled by value from a file the workers lack can still be
shown by a debugger or traceback there."""

from __future__ import annotations

from monarch.actor import Actor, endpoint, get_or_spawn_controller


class SourceLoaderController(Actor):
    @endpoint
    def get_source(self, filename: str) -> str:
        with open(filename, encoding="utf-8") as f:
            return f.read()


def source_loader_controller() -> SourceLoaderController:
    """The job's one source loader (spawned in the root client on first use)."""
    return get_or_spawn_controller("source_loader", SourceLoaderController).get()


def load_remote_source(filename: str) -> str:
    """``filename``'s text as the client's process reads it."""
    return source_loader_controller().get_source.call_one(filename).get()
