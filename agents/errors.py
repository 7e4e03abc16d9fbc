"""Errors that user programs see from the actor runtime (re-exported by ``monarch.actor``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ActorError(Exception):
    """An endpoint (or ``__init__``) raised; carries the remote traceback.

    ``exception`` is the original exception when it could be sent back,
    ``remote_traceback`` the formatted traceback from the actor's process, and
    ``actor``, ``rank`` and ``host`` say where it happened.
    """

    def __init__(self, exception: BaseException | None, remote_traceback: str = "", *, actor: str = "",
                 rank: int | None = None, host: str = "", message: str = ""):
        self.exception = exception
        self.remote_traceback = remote_traceback
        self.actor = actor
        self.rank = rank
        self.host = host
        self.message = message or (f"{type(exception).__name__}: {exception}" if exception is not None else "remote error")
        super().__init__(self._text())

    def _text(self) -> str:
        where = f"actor {self.actor!r}" + (f" rank {self.rank}" if self.rank is not None else "") + (f" on {self.host}" if self.host else "")
        text = f"{where} failed: {self.message}"
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return text

    def __reduce__(self) -> Any:
        return _make_actor_error, (self.exception, self.remote_traceback, self.actor, self.rank, self.host, self.message)


def _make_actor_error(exception, tb, actor, rank, host, message):  # pragma: no cover - trivial
    return ActorError(exception, tb, actor=actor, rank=rank, host=host, message=message)


class SupervisionError(Exception):
    """The proc (or host) running an actor died, or the actor was stopped or failed.

    Raised by every pending and later call to that actor.
    """

    def __init__(self, message: str, *, actor: str = "", rank: int | None = None, host: str = "",
                 exit_code: int | None = None):
        self.actor = actor
        self.rank = rank
        self.host = host
        self.exit_code = exit_code
        super().__init__(message)

    def __reduce__(self) -> Any:
        return _make_supervision_error, (str(self), self.actor, self.rank, self.host, self.exit_code)


def _make_supervision_error(message, actor, rank, host, exit_code):  # pragma: no cover - trivial
    return SupervisionError(message, actor=actor, rank=rank, host=host, exit_code=exit_code)


@dataclass(frozen=True)
class MeshFailure:
    """What an owner's ``__supervise__`` receives when a rank of its mesh fails."""

    mesh_name: str
    rank: int
    host: str
    reason: str
    exit_code: int | None = None

    @property
    def report(self) -> str:
        return f"mesh {self.mesh_name!r} rank {self.rank} on {self.host}: {self.reason}"

    def __str__(self) -> str:
        return self.report
