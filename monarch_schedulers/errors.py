"""What a scheduler raises when it refuses or fails a request (re-exported by ``monarch.errors``)."""

from __future__ import annotations

from monarch_agents.errors import MonarchError, UsageError

__all__ = ["SchedulerError", "UsageError"]


class SchedulerError(MonarchError):
    """The scheduler refused or failed a request."""

    exit_code = 4  # monarch.errors.ExitCode.SCHEDULER (pinned by tests/cli/test_exit_codes.py)
