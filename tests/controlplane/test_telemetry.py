"""Traces and logs carry the ids an operator searches by: a worker's traceparent is continued by the
server's span, which names the run and the decision; JSON log lines carry the same ids."""

from __future__ import annotations

import io
import json
import logging
import logging.config

import pytest
from django.test import Client
from opentelemetry import trace
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.telemetry import json_formatter
from core.telemetry import annotate, new_request

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    DjangoInstrumentor().instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        DjangoInstrumentor().uninstrument()


@pytest.mark.django_db
def test_a_workers_traceparent_is_continued_and_the_span_names_the_run(spans, worker_token, agent):
    client = Client()  # built after instrumenting: the instrumentation adds a middleware
    resp = client.post(
        "/api/v1/runs",
        data=json.dumps({"agent": "purchasing", "goal": "buy", "input": {}}),
        content_type="application/json",
        headers={
            "Authorization": f"Bearer {worker_token}",
            "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01",
        },
    )
    assert resp.status_code == 201, resp.content
    (span,) = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER]
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.attributes["controlplane.action"] == "run.create"
    assert span.attributes["controlplane.run_id"] == resp.json()["id"]


def test_json_log_lines_carry_the_decisions_ids():
    out = io.StringIO()
    logger = logging.getLogger("tests.telemetry")
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.config.DictConfigurator({}).configure_formatter(json_formatter()))
    logger.addHandler(handler)
    try:
        new_request(request_id="req-1")
        annotate(run_id="r-1", effect_id="e-1")
        logger.warning("effect declared")
        new_request(request_id="req-2")
        logger.warning("next request")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["event"] == "effect declared" and first["level"] == "warning"
    assert (first["run_id"], first["effect_id"], first["request_id"]) == ("r-1", "e-1", "req-1")
    assert (
        "run_id" not in second and second["request_id"] == "req-2"
    )  # nothing leaks across requests
