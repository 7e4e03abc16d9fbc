"""What a scheduler raises when it refuses or fails a request (re-exported by ``monarch.errors``)."""

from __future__ import annotations

from monarch_agents.errors import MonarchError, UsageError

__all__ = ["SchedulerError", "UsageError"]


class SchedulerError(MonarchError):
    """The scheduler refused or failed a request (its exit code: monarch.errors.ExitCode.SCHEDULER)."""
