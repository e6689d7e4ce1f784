"""Wiring of traces and logs for the processes (web, Celery): OpenTelemetry spans for every request
(opentelemetry-instrumentation-django; a worker's W3C ``traceparent`` is continued, so one trace
holds the agent's call and the server's work), and JSON log lines in production (structlog)."""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger(__name__)


_configured: list[str] = []  # the service this process traced as, once set up


def setup_tracing(service: str = "controlplane") -> bool:
    """Install a tracer provider and the instrumentations when ``OTEL_ENABLED=1`` (or an OTLP endpoint
    is configured), once per process (a second call is a no-op: the web process's asgi.py and the
    Celery app module may both be imported). Spans: Django and ASGI requests, psycopg statements,
    Celery publish/run (the trace follows a job from the request that enqueued it), Redis commands
    and httpx calls. They go to OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and
    ``opentelemetry-exporter-otlp`` is installed, to a JSON-lines file with ``OTEL_SPANS_FILE``
    (tests, a look without a collector), else to the console with ``OTEL_CONSOLE=1``. Returns whether
    tracing is on."""
    if not (os.environ.get("OTEL_ENABLED") == "1" or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return False
    if _configured:
        return True
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter: Any = None
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        except ImportError:
            log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp is not")
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if os.environ.get("OTEL_SPANS_FILE"):
        # written as each span ends: a process that exits (a drained replica) loses none
        provider.add_span_processor(
            SimpleSpanProcessor(FileSpanExporter(os.environ["OTEL_SPANS_FILE"]))
        )
    elif exporter is None and os.environ.get("OTEL_CONSOLE") == "1":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    _instrument()
    _configured.append(service)
    log.info("tracing on as %s", service)
    return True


def _instrument() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    DjangoInstrumentor().instrument()
    # statements without their parameters (the default): a span never carries a card number
    PsycopgInstrumentor().instrument(skip_dep_check=True)
    CeleryInstrumentor().instrument()
    RedisInstrumentor().instrument()
    HTTPXClientInstrumentor().instrument()


class FileSpanExporter(SpanExporter):
    """Spans as JSON lines appended to a file (``OTEL_SPANS_FILE``): trace and span ids, parent,
    name, kind, service and attributes. Several processes may share the file: one write per span."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Any) -> Any:
        import json

        lines = []
        for span in spans:
            ctx, parent = span.get_span_context(), span.parent
            lines.append(
                json.dumps(
                    {
                        "trace_id": f"{ctx.trace_id:032x}",
                        "span_id": f"{ctx.span_id:016x}",
                        "parent_id": f"{parent.span_id:016x}" if parent else None,
                        "name": span.name,
                        "kind": span.kind.name,
                        "service": span.resource.attributes.get("service.name"),
                        "attributes": {k: str(v) for k, v in (span.attributes or {}).items()},
                    }
                )
            )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, ("\n".join(lines) + "\n").encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
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
