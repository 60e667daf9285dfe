"""Spans for the gate's steps, inside Restate's own invocation traces.

Guarantee: off unless OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set (and
OTEL_SDK_DISABLED is not true); then `configure` builds one OpenTelemetry tracer provider exporting
over OTLP/HTTP (the SDK reads the other standard OTEL_* variables itself: headers, timeouts,
OTEL_RESOURCE_ATTRIBUTES, the batch processor's delays). Off, `step` is a context manager that
yields None and imports nothing of OpenTelemetry. On, spans come from restate.ext.tracing's
RestateTracer: each is a child of the invocation attempt's span that restate-server sends in the
attempt's `traceparent` (so they sit in Restate's trace of the invocation when restate-server has
a tracing endpoint), and a step that is replayed from the journal makes no span at all. Attributes
are the names in `ATTRIBUTES`: ids, names and outcomes, never argument values, facts, reasons or
tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from restate.server_context import current_context

from countersign.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("countersign.observability.tracing")

ATTRIBUTES = {
    "tool": "countersign.tool",
    "approval_id": "countersign.approval_id",
    "run_id": "countersign.run_id",
    "tenant": "countersign.tenant",
    "verdict": "countersign.verdict",
    "source": "countersign.decision_source",
    "channel": "countersign.channel",
    "outcome": "countersign.outcome",
    "kind": "countersign.kind",
}
"""The only attributes a span may carry (keyword → attribute name)."""

_tracer: Tracer | None = None


def enabled(settings: Settings) -> bool:
    endpoint = settings.otel_exporter_otlp_traces_endpoint or settings.otel_exporter_otlp_endpoint
    return bool(endpoint) and not settings.otel_sdk_disabled


def configure(settings: Settings) -> bool:
    """Start exporting spans if the OTEL settings ask for it (once per process); whether it is on."""
    global _tracer
    if _tracer is not None or not enabled(settings):
        return _tracer is not None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from restate.ext.tracing import RestateTracer

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: settings.otel_service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _tracer = RestateTracer(provider.get_tracer("countersign"))  # type: ignore[no-untyped-call]
    log.info("traces: exported over OTLP/HTTP as service %s", settings.otel_service_name)
    return True


def tracing_on() -> bool:
    return _tracer is not None


def attributes(**values: Any) -> dict[str, str | int | float | bool]:
    """Known keywords only (a typo is a bug, not a new attribute); None values are left out."""
    return {ATTRIBUTES[key]: value for key, value in values.items() if value is not None}


@contextmanager
def step(name: str, **values: Any) -> Iterator[Span | None]:
    """A span named `name` around a journaled step (None when tracing is off, outside a handler, or
    while the journal replays). An exception ends it with an error status and its type only: an
    exception's message may quote arguments."""
    with _span(name, None, values) as span:
        yield span


def since(name: str, start: float, **values: Any) -> None:
    """A span that began at `start` (epoch seconds, e.g. an approval's request) and ends now."""
    with _span(name, int(start * 1e9), values):
        pass


@contextmanager
def _span(name: str, start_ns: int | None, values: dict[str, Any]) -> Iterator[Span | None]:
    tracer = _tracer
    if tracer is None or not _in_handler():
        yield None
        return
    from opentelemetry.trace import INVALID_SPAN, Status, StatusCode

    span = tracer.start_span(name, attributes=attributes(**values), start_time=start_ns, record_exception=False)
    if span is INVALID_SPAN:  # replaying: this step ran in an earlier attempt, which traced it
        yield None
        return
    try:
        yield span
    except Exception as exc:
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()


def _in_handler() -> bool:
    try:
        return current_context() is not None
    except LookupError:  # the SDK's context variable has no default
        return False


def annotate(span: Span | None, **values: Any) -> None:
    """Add attributes learnt during the step (e.g. its outcome)."""
    if span is not None:
        span.set_attributes(attributes(**values))
