"""Errors a user of the ``monarch`` command can meet, each with the command that fixes it.

Parts raise these; only ``monarch_cli/errors.py`` turns them into one red line,
the hint, and an exit code.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """The exit codes of ``monarch``: the one table, honoured by every command.

    A run that started passes its first failed rank's own exit code through instead (as ssh
    does); with ``--json`` the document says which it was.
    """

    OK = 0
    FAILED = 1
    USAGE = 2
    STATE = 3
    SCHEDULER = 4
    AGENT = 5
    RUN = 6
    WORKSPACE = 7
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "the command run failed (its own exit code is passed through), or an internal error",
    ExitCode.USAGE: "bad usage",
    ExitCode.STATE: "no reservation, an unusable state file, or the allocation is gone",
    ExitCode.SCHEDULER: "the scheduler refused or failed",
    ExitCode.AGENT: "a host agent does not answer or died",
    ExitCode.RUN: "a run could not start",
    ExitCode.WORKSPACE: "the workspace could not be synced to the hosts",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C): every rank was stopped",
}


# The base, UsageError and SchedulerError live where the lowest layer raising them can reach them
# (schedulers may not import monarch); they are monarch.errors' all the same, their codes the
# table's (written there as numbers; tests/cli/test_exit_codes.py pins them to it).
from monarch_agents.errors import MonarchError, UsageError, install_hint, missing_part  # noqa: E402, F401
from monarch_schedulers.errors import SchedulerError  # noqa: E402, F401  (re-exported)
# A folder monarch keeps private files in is another user's or open to others (monarch_rdmafs.private).
from monarch_agents.files import UnsafeFolder  # noqa: E402,F401


class StateError(MonarchError):
    """No reservation, or a state file that is corrupt, of another version, or dead."""

    exit_code = ExitCode.STATE


class AgentError(MonarchError):
    """A host agent could not be reached or died."""

    exit_code = ExitCode.AGENT


class RunError(MonarchError):
    """A command could not be run (another run going on, bad arguments)."""

    exit_code: int = ExitCode.RUN  # int: RunFailed passes a rank's own status through


class RunFailed(RunError):
    """A run ended badly: a rank failed, its host agent was lost, the reservation ended under it, or
    it was interrupted.  Worded by the engine (``monarch._workbench.run.run_failure``); ``exit_code``
    is the run's own status (a rank's code passed through, 128+N for a signal N, or this table's).
    A :class:`RunError`, so ``run_spmd``'s callers catch it as before."""

    def __init__(self, message: str, hint: str = "", *, exit_code: int, run_id: str = "", interrupted: bool = False):
        super().__init__(message, hint)
        self.exit_code = exit_code
        self.run_id = run_id
        self.interrupted = interrupted


class WorkspaceError(MonarchError):
    """The workspace could not be synced to the hosts (unreadable path, a host died or is full)."""

    exit_code = ExitCode.WORKSPACE


class QueryError(UsageError):
    """SQL that does not parse, names an unknown table or column, tries to write, or ran past its timeout."""
