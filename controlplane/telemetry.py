"""Wiring of traces and logs for the processes (web, Celery): OpenTelemetry spans for every request
(opentelemetry-instrumentation-django; a worker's W3C ``traceparent`` is continued, so one trace
holds the agent's call and the server's work), and JSON log lines in production (structlog)."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def setup_tracing(service: str = "controlplane") -> bool:
    """Install a tracer provider and instrument Django when ``OTEL_ENABLED=1`` (or an OTLP endpoint is
    configured). Spans go to the OTLP exporter if ``opentelemetry-exporter-otlp`` is installed, else to
    the console with ``OTEL_CONSOLE=1``. Returns whether tracing is on."""
    if not (os.environ.get("OTEL_ENABLED") == "1" or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return False
    from opentelemetry import trace
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter: Any = None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    except ImportError:
        if os.environ.get("OTEL_CONSOLE") == "1":
            exporter = ConsoleSpanExporter()
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    log.info("tracing on (%s)", type(exporter).__name__ if exporter else "no exporter")
    return True


def json_formatter() -> dict[str, Any]:
    """A logging formatter config: one JSON object per line, with the ids bound by
    ``core.telemetry.annotate`` (run_id, attempt_id, effect_id, intervention_id, request_id)."""
    import structlog

    return {
        "()": structlog.stdlib.ProcessorFormatter,
        "processors": [
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(),
        ],
        "foreign_pre_chain": [
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            # the fields a record carries in ``extra=`` (the access log's method, path, status, ...)
            structlog.stdlib.ExtraAdder(),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
        ],
    }
