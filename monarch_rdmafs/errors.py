"""What can go wrong in a sync, each with a message a user can act on."""

from __future__ import annotations


class SyncError(Exception):
    """A sync could not be done; ``message`` is one line, ``hint`` what to do about it."""

    def __init__(self, message: str, hint: str = ""):
        self.message = message
        self.hint = hint
        super().__init__(message + (f" ({hint})" if hint else ""))


class WorkspaceUnreadable(SyncError):
    """The workspace path is missing or unreadable, or files inside it are and the user chose to refuse."""


class SourceChanged(SyncError):
    """A file changed while it was being sent; the sync is retried from a fresh snapshot."""


class CorruptChunk(SyncError):
    """A chunk's bytes do not match its id (corrupted in transit)."""


class StoreFull(SyncError):
    """A host's disk is full; the generation it serves stays the previous one."""
