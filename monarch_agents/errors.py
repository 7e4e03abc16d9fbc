"""Errors that user programs see from the actor runtime (re-exported by ``monarch.actor``).

The texts open with PyTorch Monarch's wording (programs and tests match on it:
"Actor call X.m failed.", "Endpoint call X.m() failed, The actor ... and all its
descendants have failed:") and go on with ours: which rank, which host, why.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

_TB_HEAD = "Traceback (most recent call last):"
_REMOTE_TB_HEAD = "Traceback of where the remote call failed (most recent call last):"


class ActorError(Exception):
    """An endpoint (or ``__init__``) raised; carries the remote traceback.

    ``exception`` is the original exception when it could be sent back,
    ``message`` Monarch's one-line summary ("Actor call name.method failed."),
    ``exception_formatted`` the traceback from the actor's process, and
    ``actor``, ``rank`` and ``host`` say where it happened.
    """

    def __init__(self, exception: BaseException | None, message: str = "A remote actor call has failed.", *,
                 remote_traceback: str | None = None, actor: str = "", rank: int | None = None, host: str = ""):
        self.exception = exception
        if remote_traceback is None:
            remote_traceback = "" if exception is None else "".join(traceback.format_exception(exception))
        self.remote_traceback = remote_traceback
        self.exception_formatted = remote_traceback.replace(_TB_HEAD, _REMOTE_TB_HEAD)
        self.message = message
        self.actor = actor
        self.rank = rank
        self.host = host
        super().__init__(self._text())

    def _text(self) -> str:
        where = []
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.host:
            where.append(f"on {self.host}")
        what = f"{type(self.exception).__name__}: {self.exception}" if self.exception is not None else ""
        detail = " ".join(where) + (": " if where and what else "") + what
        text = self.message + (f" ({detail})" if detail else "")
        if self.exception_formatted:
            text += "\n " + self.exception_formatted.rstrip()
        return text

    def __str__(self) -> str:
        return self._text()

    def __reduce__(self) -> Any:
        return _make_actor_error, (self.exception, self.message, self.remote_traceback, self.actor, self.rank, self.host)


def _make_actor_error(exception, message, tb, actor, rank, host):  # pragma: no cover - trivial
    return ActorError(exception, message, remote_traceback=tb, actor=actor, rank=rank, host=host)


class SupervisionError(RuntimeError):
    """The proc (or host) running an actor died, or the actor was stopped or failed.

    Raised by every pending and later call to that actor.  As in Monarch it is a
    ``RuntimeError``; ``endpoint`` names the call that failed, when one did.
    """

    #: The proc that refused a send, when one did (the failure then names the actor there).
    failed_addr: str = ""

    def __init__(self, message: str, *, actor: str = "", rank: int | None = None, host: str = "",
                 exit_code: int | None = None, endpoint: str | None = None):
        self.message = message
        self.actor = actor
        self.rank = rank
        self.host = host
        self.exit_code = exit_code
        self.endpoint = endpoint
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.endpoint:
            return f"Endpoint call {self.endpoint} failed, {self.message}"
        return self.message

    def __reduce__(self) -> Any:
        return _make_supervision_error, (self.message, self.actor, self.rank, self.host, self.exit_code, self.endpoint)


class OversizedMessage(SupervisionError):
    """A message longer than ``codec_max_frame_length`` was not sent (a call's arguments, an
    answer): the call fails with it; the actor and the connection to it are fine."""


def _make_supervision_error(message, actor, rank, host, exit_code, endpoint=None):  # pragma: no cover - trivial
    return SupervisionError(message, actor=actor, rank=rank, host=host, exit_code=exit_code, endpoint=endpoint)


def actor_failed_text(actor: str, reason: str) -> str:
    """Monarch's report of a failed actor, with our reason indented below it."""
    body = "\n".join("  " + line for line in reason.rstrip().splitlines()) or "  (no reason given)"
    return f"The actor {actor} and all its descendants have failed:\n{body}"


@dataclass(frozen=True)
class MeshFailure:
    """What an owner's ``__supervise__`` receives when a rank of its mesh fails.

    ``failure.report()`` is the readable report (a method, as in Monarch);
    ``mesh_name``, ``rank``, ``host``, ``reason`` and ``exit_code`` are the parts.
    """

    mesh_name: str
    rank: int
    host: str
    reason: str
    exit_code: int | None = None
    crashed_ranks: tuple = field(default=())

    @property
    def mesh(self) -> str:
        return self.mesh_name

    def report(self) -> str:
        """User-readable report of this failure."""
        return f"mesh {self.mesh_name!r} rank {self.rank} on {self.host}: {self.reason}"

    def __str__(self) -> str:
        ranks = list(self.crashed_ranks) or [self.rank]
        return f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks={ranks}, event={self.report()})"


# -- errors a user of the `monarch` command meets --------------------------------------------
# Defined at the lowest layer that raises them (schedulers do too); ``monarch.errors`` is where
# users and the CLI import them from.


class MonarchError(Exception):
    """Base: ``message`` is one line; ``hint`` is the command or step that fixes it."""

    # The codes are monarch.errors.ExitCode's (the one table, which this layer cannot import):
    # written here as numbers, pinned to the table by tests/cli/test_exit_codes.py.
    exit_code: int = 1  # ExitCode.FAILED

    def __init__(self, message: str, hint: str = ""):
        self.message = message
        self.hint = hint
        super().__init__(message + (f" ({hint})" if hint else ""))


class UsageError(MonarchError):
    """The command line (or an API call) asked for something impossible."""

    exit_code = 2  # ExitCode.USAGE


#: The optional parts of monarch: a missing module -> (what needs it, the pip extra that brings it).
#: One table, so that every "No module named ..." a user can meet names the extra and the command.
OPTIONAL_PARTS: dict[str, tuple[str, str]] = {
    "kubernetes": ("the kubernetes scheduler", "kubernetes"),
    "yaml": ("the kubernetes scheduler", "kubernetes"),
    "pyfuse3": ("FUSE workspace mounts and gather_mount", "fuse"),
    "trio": ("FUSE workspace mounts and gather_mount", "fuse"),
    "submitit": ("submitit on a reservation", "slurm"),
    "torchx": ("TorchX AppDefs", "slurm"),
    "torch": ("torchrun and the DDP examples", "torch"),
    "numpy": ("torchrun and the DDP examples", "torch"),
}


def install_hint(extra: str) -> str:
    """The command that installs an optional part (FUSE also needs libfuse3's headers to build)."""
    cmd = f"pip install 'monarch-workbench[{extra}]'"
    if extra == "fuse":
        cmd = f"apt-get install fuse3 libfuse3-dev pkg-config, then {cmd}"
    if extra == "torch":
        cmd += " (scripts/install.sh installs it)"
    return cmd


def missing_part(e: BaseException) -> tuple[str, str] | None:
    """(message, hint) when ``e`` is an optional part that is not installed, else None."""
    if not isinstance(e, ImportError):
        return None
    top = (getattr(e, "name", None) or "").split(".")[0]
    if top not in OPTIONAL_PARTS:
        return None
    what, extra = OPTIONAL_PARTS[top]
    return (f"{what} needs the optional '{extra}' part, which is not installed (no module named {top!r})",
            install_hint(extra))
