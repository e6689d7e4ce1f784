"""One trace from an SDK call through the API to the Celery job it enqueued, on real processes
(daphne under controlplane.serve, a Celery worker, a private Redis): the SDK's httpx span (in this
process), the API's request span and its psycopg statements, the Celery publish and the job's run
in the worker all share one trace id (controlplane/telemetry.py, docs/operations/metrics.md)."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane_sdk import Client
from tests.deploy.hosts import start_api, start_redis
from tests.live import server_env, start_celery, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_one_trace_follows_an_sdk_call_through_the_api_to_its_celery_job(
    procs, tmp_path, worker_token, cast
):
    spans_file = tmp_path / "spans.jsonl"
    redis = start_redis(procs)
    env = server_env(
        tmp_path,
        REDIS_URL=f"redis://127.0.0.1:{redis}/0",
        OTEL_ENABLED="1",
        OTEL_SPANS_FILE=str(spans_file),
    )
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    base, api_log = start_api(procs, env)
    celery_log = start_celery(procs, env)

    worker = Client(base, worker_token, timeout=30)
    run = worker.create_run(
        "purchasing", "trace", versions={"code": "1.0.0"},
        authority=[{"scope": "payments:charge", "ttl_s": 3600}],
    )  # fmt: skip
    token = worker.claim(run["id"], "worker-1").lease.fencing_token
    effect = worker.declare_effect(
        run["id"], token, step="charge", tool="payments", action="charge",
        idempotency_key="trace-charge", args={"amount": 1},
    )  # fmt: skip
    worker.record_outcome(effect.id, token, "unknown")

    # This process's side: its own provider (the test process's global one is left alone) and the
    # httpx instrumentation on this one client only.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    operator = Client(base, cast["otto"][1], timeout=30)
    HTTPXClientInstrumentor.instrument_client(operator._http, tracer_provider=provider)
    with provider.get_tracer("test").start_as_current_span("operator reconciles") as root:
        # the reconcile intervention: decided in the request, carried out by a Celery job
        operator.intervene(run["id"], "reconcile", "ask the payment processor")
    trace_id = f"{root.get_span_context().trace_id:032x}"
    client_spans = [s for s in exporter.get_finished_spans() if s.kind == trace.SpanKind.CLIENT]
    assert client_spans, exporter.get_finished_spans()  # the SDK's httpx call

    def spans() -> list[dict]:
        if not spans_file.exists():
            return []
        lines = spans_file.read_text().splitlines()
        return [s for s in map(json.loads, filter(None, lines)) if s["trace_id"] == trace_id]

    def job_ran() -> bool:
        return any(
            s["service"] == "controlplane-worker" and s["kind"] == "CONSUMER" for s in spans()
        )

    wait_for("the Celery job's span", job_ran, 30, logs=(api_log, celery_log))
    got = spans()
    by_service = {(s["service"], s["kind"]) for s in got}
    assert ("controlplane", "SERVER") in by_service, got  # the API's request span
    assert ("controlplane", "PRODUCER") in by_service, got  # Celery publish, from the request
    assert ("controlplane-worker", "CONSUMER") in by_service, got  # the job run
    db = [s for s in got if s["kind"] == "CLIENT" and "db.system" in str(s["attributes"])]
    assert {s["service"] for s in db} >= {"controlplane", "controlplane-worker"}, got
    # the API's request span is the child of the SDK's httpx span: the header carried it
    server = [s for s in got if s["service"] == "controlplane" and s["kind"] == "SERVER"]
    http_ids = {f"{s.get_span_context().span_id:016x}" for s in client_spans}
    assert any(s["parent_id"] in http_ids for s in server), (server, http_ids)
