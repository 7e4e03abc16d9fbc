"""Monarch's tracing helpers: ``span``, ``traced``, ``get_meter``, ``TracingForwarder``.

Where Monarch hands spans and metrics to its Rust tracing (and on to its distributed telemetry
tables), ours go into this process's telemetry recorder, so they become rows of the ``user_spans``
and ``metrics`` tables that ``monarch query`` reads (``SELECT name, duration_us FROM user_spans``;
Monarch's ``spans`` shows them as its rows),
tagged with the actor they ran in.  ``TracingForwarder`` is a ``logging.Handler`` that adds the
current actor to each record (``record.actor_id``) and records the line in the ``logs`` table.

The meter takes the calls of OpenTelemetry's meter (``create_counter(name).add(n, attributes)``,
``create_up_down_counter``, ``create_histogram(name).record(v)``); the observable instruments and
gauges raise ``NotImplementedError``, as Monarch's do.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import time
from typing import Any, Callable, Mapping, Optional, TypeVar, overload

from monarch_telemetry.recorder import now_us, recorder

R = TypeVar("R")


def _actor_name() -> str:
    from monarch_agents.context import current

    info = current().actor
    if info is None:
        return "<root>"
    return info.qualname or f"{info.name}[{info.rank}]"


class Span:
    """A timed section: ``with span("load"): ...`` records one ``user_spans`` row when it ends."""

    __slots__ = ("name", "_start_us", "_t0", "_actor")

    def __init__(self, name: str, actor: str | None = None):
        self.name = name
        self._actor = actor
        self._start_us = 0
        self._t0 = 0.0

    def __enter__(self) -> "Span":
        self._start_us = now_us()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any = None, exc: Any = None, tb: Any = None) -> None:
        duration = int((time.perf_counter() - self._t0) * 1e6)
        error = None if exc is None else f"{type(exc).__name__}: {exc}"
        recorder().span(self._start_us, self._actor or _actor_name(), self.name, duration, error)


def span(name: str) -> Span:
    """A span called ``name`` in the current actor (or the client's ``<root>``)."""
    return Span(name)


@overload
def traced(fn: Callable[..., R]) -> Callable[..., R]: ...


@overload
def traced(*, name: str) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def traced(fn: Callable[..., R] | None = None, *, name: str | None = None) -> Any:
    """Run each call of ``fn`` (sync or ``async``) inside a span named ``name`` (default: its ``__name__``)."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        label = name if name is not None else f.__name__
        if inspect.iscoroutinefunction(f):
            @functools.wraps(f)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with Span(label):
                    return await f(*args, **kwargs)
            return run_async

        @functools.wraps(f)
        def run(*args: Any, **kwargs: Any) -> Any:
            with Span(label):
                return f(*args, **kwargs)
        return run

    return wrap(fn) if fn is not None else wrap


def _attrs(attributes: Optional[Mapping[str, Any]]) -> str | None:
    if not attributes:
        return None
    return json.dumps({str(k): str(v) for k, v in attributes.items()}, sort_keys=True)


class _Sink:
    """Where an instrument's values go: rows of the ``metrics`` table.  An instrument holds it as
    ``inner`` (Monarch's name for its Rust instrument, which Monarch's tests replace to watch the
    values and attributes an instrument passes on)."""

    def __init__(self, name: str, kind: str):
        self.name = name
        self.kind = kind

    def add(self, amount: float, attributes: Optional[Mapping[str, str]] = None) -> None:
        recorder().metric(_actor_name(), self.name, self.kind, amount, _attrs(attributes))

    record = add


class _Instrument:
    kind = ""

    def __init__(self, name: str, unit: str = "", description: str = ""):
        self.name = name
        self.unit = unit
        self.description = description
        self.inner: Any = _Sink(name, self.kind)

    @staticmethod
    def _strings(attributes: Optional[Mapping[str, Any]]) -> Optional[dict[str, str]]:
        # As in Monarch, attribute values travel as strings.
        return None if attributes is None else {str(k): str(v) for k, v in attributes.items()}


class Counter(_Instrument):
    """A monotonic counter: ``add(n)`` with n >= 0."""

    kind = "counter"

    def add(self, amount: float, attributes: Optional[Mapping[str, Any]] = None, context: Any = None) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up; add({amount}) is negative (use an up-down counter)")
        self.inner.add(amount, attributes=self._strings(attributes))


class UpDownCounter(_Instrument):
    kind = "up_down_counter"

    def add(self, amount: float, attributes: Optional[Mapping[str, Any]] = None, context: Any = None) -> None:
        self.inner.add(amount, attributes=self._strings(attributes))


class Histogram(_Instrument):
    kind = "histogram"

    def record(self, amount: float, attributes: Optional[Mapping[str, Any]] = None, context: Any = None) -> None:
        self.inner.record(amount, attributes=self._strings(attributes))


class Meter:
    """Makes instruments whose values become rows of the ``metrics`` table."""

    def __init__(self, name: str = "monarch", version: str | None = None, schema_url: str | None = None):
        self.name = name
        self.version = version
        self.schema_url = schema_url

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        return Counter(name, unit, description)

    def create_up_down_counter(self, name: str, unit: str = "", description: str = "") -> UpDownCounter:
        return UpDownCounter(name, unit, description)

    def create_histogram(self, name: str, unit: str = "", description: str = "", **_: Any) -> Histogram:
        return Histogram(name, unit, description)

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("observable instruments and gauges are not recorded (as in Monarch)")

    create_gauge = create_observable_counter = create_observable_gauge = _unsupported
    create_observable_up_down_counter = _unsupported


_METER = Meter("monarch")


def get_meter() -> Meter:
    """This process's meter (Monarch's process-global one)."""
    return _METER


class TracingForwarder(logging.Handler):
    """A logging handler that tags each record with the current actor and records it in ``logs``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from monarch_agents.context import current

            info = current().actor
            if info is not None:
                record.actor_id = info.qualname or info.actor_id
            recorder().log_line("stderr" if record.levelno >= logging.WARNING else "stdout", self.format(record),
                                proc=_actor_name())
        except Exception:
            self.handleError(record)


def log_with_tracing(level: int, msg: object, *args: object, logger: logging.Logger | None = None,
                     **kwargs: Any) -> None:
    """Log through ``logger`` (its handlers as usual) and record the line in ``logs`` as well."""
    lg = logger or logging.getLogger(__name__)
    kwargs.setdefault("stacklevel", 2)
    lg.log(level, msg, *args, **kwargs)
    recorder().log_line("stdout", str(msg) % args if args else str(msg), proc=_actor_name())


def get_monarch_tracer() -> Any:
    """A tracer for older call sites; spans go through :func:`span` (Monarch returns a no-op tracer too)."""
    return _NoTracer()


class _NoTracer:
    def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> Span:
        return Span(name)

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> Span:
        return Span(name)
