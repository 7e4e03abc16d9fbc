"""The one rule that turns how a process ended into an exit status, as a shell reports it.

Agents, ``subprocess`` and ``waitpid`` say "killed by signal N" as ``-N``; a process exit status
is one byte, and ``-9`` taken as a byte is 247, which reads as an ordinary failure.  Every command
that passes a rank's end on as its own status (``monarch run``, ``monarch exec``, an actor
program, submitit's tasks, ``monarch logs --list``) goes through :func:`exit_status`; the run-level
rule (which rank's status a run takes) is :meth:`monarch._workbench.run.RunOutcome.exit_code`.

Standard library only: submitit's per-host launcher imports it on every rank.
"""

from __future__ import annotations

import signal

#: What a process whose end is unknown counts as (``monarch.errors.ExitCode.FAILED``).
_UNKNOWN = 1


def exit_status(code: int | None) -> int:
    """A process's end as a shell's ``$?``: its own code 0..255, a signal N (``-N``) as 128+N, unknown as 1."""
    if code is None:
        return _UNKNOWN
    if code < 0:
        return 128 - code
    return code


def signal_of(status: int | None) -> signal.Signals | None:
    """The signal an exit status 128+N (or a raw ``-N``) stands for; None for an ordinary exit code."""
    if status is None:
        return None
    n = -status if status < 0 else status - 128 if 128 < status < 128 + 65 else 0
    try:
        return signal.Signals(n) if n > 0 else None
    except ValueError:
        return None
