"""Compatibility only: Monarch's ``monarch._src.actor.telemetry`` names, aliases of ``monarch.actor._tracing``."""

from monarch.actor._tracing import (  # noqa: F401
    Counter,
    Histogram,
    Meter,
    Span as PySpan,
    TracingForwarder,
    UpDownCounter,
    get_meter,
    get_monarch_tracer,
    log_with_tracing,
    span,
    traced,
)

METER = get_meter()


def install() -> None:
    """Monarch installs its meter provider here; ours records through the recorder already."""
