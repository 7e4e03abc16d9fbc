"""The endpoint descriptor: what ``@endpoint`` puts on an Actor class, read by the proc agent.

``monarch.actor`` makes these (``@endpoint``, ``@concurrent_endpoint``, ``as_endpoint``) and
re-exports the class; the proc agent that calls endpoints reads them here, through their public
fields, so the agents never reach into the API layer's private state.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Generic, TypeVar

R = TypeVar("R")


class EndpointProperty(Generic[R]):
    """What ``@endpoint`` puts on an Actor class: the function and how it is called.

    ``explicit_response_port``: the function takes the reply port as its first argument and answers
    through it (``as_endpoint(..., explicit_response_port=True)``); ``concurrent``: calls overlap
    instead of running one at a time (``@concurrent_endpoint``).
    """

    def __init__(self, fn: Callable[..., R], *, explicit_response_port: bool = False, concurrent: bool = False,
                 propagate: Any = None, instrument: bool = True):
        self.fn = fn
        self.explicit_response_port = explicit_response_port
        self.concurrent = concurrent
        self.propagate = propagate  # what ``endpoint.rref`` results look like (the tensor engine's)
        self._signature: inspect.Signature | None = None
        self._positional: tuple[int, int] | None = None  # (required, accepted), when that settles it
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "endpoint")

    @property
    def _explicit_response_port(self) -> bool:
        """Monarch's name, which its own tests read: whether the body answers through a port rather
        than by returning, as a concurrent endpoint's task does in Monarch (each call's task sends its
        own answer), so true for those too."""
        return self.explicit_response_port or self.concurrent

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return self.fn.__get__(obj, objtype)

    def check_args(self, args: tuple, kwargs: dict) -> None:
        """Raise TypeError now, in the caller, for arguments the endpoint cannot take."""
        if self._signature is None:
            self._signature = inspect.signature(self.fn)
            self._positional = _positional_only_shape(self._signature)
        extra = (None, None) if self.explicit_response_port else (None,)
        # Signature.bind costs more than the rest of sending a message; a count of
        # positional arguments decides most calls.
        if not kwargs and self._positional is not None:
            required, accepted = self._positional
            if required <= len(extra) + len(args) <= accepted:
                return
        self._signature.bind(*extra, *args, **kwargs)


def _positional_only_shape(sig: inspect.Signature) -> tuple[int, int] | None:
    """(required, accepted) positional arguments, for a signature with no ``*``/``**`` or keyword-only ones."""
    required = accepted = 0
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return None
        accepted += 1
        required += p.default is p.empty
    return required, accepted


class PlainMethod(EndpointProperty):
    """A method not marked ``@endpoint``, called through ``as_endpoint``: an endpoint all the same."""

    def __init__(self, fn: Callable[..., Any], explicit_response_port: bool):
        super().__init__(fn, explicit_response_port=explicit_response_port)
