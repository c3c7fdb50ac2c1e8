"""OpenTelemetry spans for each document's work and each external call.

Off unless the standard variables ask for it: ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``)
or ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP over HTTP; the
exporter reads its endpoint, headers and timeout from the same ``OTEL_*`` variables). A process
whose tracer provider is already set (a host application, a test's in-memory exporter) keeps it.

A document's work is one root span, ``ai_pipeline.document`` — a trace per document — and every
span under it (each LLM attempt, each retry wait, each notice, each store write) carries the
``ai_pipeline.task_id`` and ``ai_pipeline.document_id`` of the work it belongs to, taken from the
context the document's coroutine runs in; a failure adds its category and layer.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

from ai_pipeline.failures import Category

TASK_ID = "ai_pipeline.task_id"
DOCUMENT_ID = "ai_pipeline.document_id"
RUN_ID = "ai_pipeline.run_id"
CATEGORY = "ai_pipeline.category"
LAYER = "ai_pipeline.layer"

# The task and document whose work the current coroutine (or thread) is doing.
_current: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "ai_pipeline_trace_attributes", default=None
)
_configured = threading.Lock()
_done = False


def configure_from_env() -> bool:
    """Install an SDK tracer provider with the exporter the OTEL_* variables name, once per
    process; True when spans are exported."""
    global _done
    with _configured:
        if _done:
            return _exporting()
        _done = True
        exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        if exporter_name in ("", "none") and not endpoint:
            return _exporting()
        if exporter_name == "none":
            return _exporting()
        if _exporting():
            return True  # someone else set the provider: theirs wins
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )

        exporter: SpanExporter
        if exporter_name == "console":
            exporter = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        service = os.environ.get("OTEL_SERVICE_NAME", "ai_pipeline")
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        return True


def _exporting() -> bool:
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def tracer() -> trace.Tracer:
    return trace.get_tracer("ai_pipeline")


@contextmanager
def document_span(document_id: str, task_id: str, run_id: str | None) -> Iterator[trace.Span]:
    """The root span of one document's work; everything under it carries its ids."""
    attributes = {TASK_ID: task_id, DOCUMENT_ID: document_id}
    if run_id:
        attributes[RUN_ID] = run_id
    if not _exporting():
        # Nothing records spans: none is made (through the proxy tracer each cost about 6 us
        # of CPU, and a document's work makes several).
        yield trace.INVALID_SPAN
        return
    token = _current.set(attributes)
    try:
        # A new trace per document: its spans stay together, whatever else the run does.
        with tracer().start_as_current_span(
            "ai_pipeline.document",
            context=trace.set_span_in_context(trace.INVALID_SPAN),
            attributes=attributes,
        ) as span:
            yield span
    finally:
        _current.reset(token)


@contextmanager
def span(name: str, *, task_id: str | None = None, **attributes: Any) -> Iterator[trace.Span]:
    """A span for one external call or write, with the current task's ids (``task_id`` names
    another task of the same document, e.g. a section's)."""
    if not _exporting():
        yield trace.INVALID_SPAN
        return
    ids = dict(_current.get() or {})
    if task_id:
        ids[TASK_ID] = task_id
    clean = {k: v for k, v in attributes.items() if v is not None}
    with tracer().start_as_current_span(name, attributes={**ids, **clean}) as current:
        yield current


def mark_failed(current: trace.Span, category: Category, message: str) -> None:
    """A span's failure: its category, layer and message."""
    current.set_attribute(CATEGORY, category.value)
    current.set_attribute(LAYER, category.rule.layer.value)
    current.set_status(trace.Status(trace.StatusCode.ERROR, message[:200]))


def flush(timeout_millis: int = 10_000) -> None:
    """Export what is pending (a run worker exits right after its step)."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_millis)
