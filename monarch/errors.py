"""Errors a user of the ``monarch`` command can meet, each with the command that fixes it.

Parts raise these; only ``monarch_cli/errors.py`` turns them into one red line,
the hint, and an exit code.
"""

from __future__ import annotations


class MonarchError(Exception):
    """Base: ``message`` is one line; ``hint`` is the command or step that fixes it."""

    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        self.message = message
        self.hint = hint
        super().__init__(message + (f" ({hint})" if hint else ""))


class StateError(MonarchError):
    """No reservation, or a state file that is corrupt, of another version, or dead."""

    exit_code = 3


class SchedulerError(MonarchError):
    """The scheduler refused or failed a request."""

    exit_code = 4


class AgentError(MonarchError):
    """A host agent could not be reached or died."""

    exit_code = 5


class RunError(MonarchError):
    """A command could not be run (another run going on, bad arguments)."""

    exit_code = 6


class UsageError(MonarchError):
    """The command line asked for something impossible."""

    exit_code = 2


class WorkspaceError(MonarchError):
    """The workspace could not be synced to the hosts (unreadable path, a host died or is full)."""

    exit_code = 7


class QueryError(UsageError):
    """SQL that does not parse, names an unknown table or column, tries to write, or ran past its timeout."""
