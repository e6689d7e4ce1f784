"""/healthz and /readyz on a real API process (controlplane.serve): readiness follows PostgreSQL and
Redis going away and coming back within seconds, names what is missing, and the probes leave no
audit event and no access-log line."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from django.db import connection

from tests.deploy.hosts import Forwarder, start_api, start_redis
from tests.live import server_env, test_database_url, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _ready(base: str) -> tuple[int, dict]:
    try:
        response = httpx.get(f"{base}/readyz", timeout=10)
    except httpx.HTTPError as exc:
        return 0, {"error": str(exc)}
    return response.status_code, response.json()


def _becomes(base: str, status: int, within: float) -> tuple[float, dict]:
    """Seconds until /readyz answers ``status`` (probing as a load balancer would, every 0.2 s)."""
    started, seen = time.monotonic(), {}

    def probe() -> bool:
        nonlocal seen
        code, seen = _ready(base)
        return code == status

    wait_for(f"/readyz to answer {status} (last: {seen})", probe, within, interval=0.2)
    return time.monotonic() - started, seen


def test_it_is_ready_then_not_while_redis_is_down_then_ready_again(procs, tmp_path):
    from audit.models import AuditEvent

    port = start_redis(procs)
    base, log = start_api(procs, server_env(tmp_path, REDIS_URL=f"redis://127.0.0.1:{port}/0"))
    alive = httpx.get(f"{base}/healthz", timeout=5)
    assert alive.status_code == 200 and alive.json()["status"] == "alive"
    status, body = _ready(base)
    assert status == 200, body
    assert body["status"] == "ready"
    assert {k: v["ok"] for k, v in body["checks"].items()} == {
        "database": True,
        "channel_layer": True,
        "broker": True,
    }
    audit_before = AuditEvent.objects.count()

    procs.stop({"redis"})
    took, body = _becomes(base, 503, within=10)
    assert took < 5, took
    assert not body["checks"]["channel_layer"]["ok"] and not body["checks"]["broker"]["ok"]
    assert "Connection" in body["checks"]["broker"]["error"], body
    assert body["checks"]["database"]["ok"]
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200  # alive: no restart wanted

    start_redis(procs, port=port)
    took, body = _becomes(base, 200, within=10)
    assert took < 5, took
    assert AuditEvent.objects.count() == audit_before  # probes are not audited
    lines = log.read_text()
    assert "/readyz" not in lines and "/healthz" not in lines, lines[-2000:]


def test_it_is_not_ready_while_postgres_is_unreachable_then_ready_again(procs, tmp_path):
    db = connection.settings_dict
    path = Forwarder((db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)))
    url = test_database_url().replace(f":{db.get('PORT') or 5432}/", f":{path.port}/")
    port = start_redis(procs)
    env = server_env(tmp_path, DATABASE_URL=url, REDIS_URL=f"redis://127.0.0.1:{port}/0")
    base, _ = start_api(procs, env)
    assert _ready(base)[0] == 200
    # the process's first Django request imports and builds the API (seconds at load 13): before
    # the cut, so the refusal below is timed alone
    assert httpx.get(f"{base}/api/v1/runs", timeout=30).status_code == 401
    try:
        path.cut()
        took, body = _becomes(base, 503, within=10)
        assert took < 5, took
        assert not body["checks"]["database"]["ok"], body
        assert body["checks"]["broker"]["ok"]
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        # an API call that needs the database is refused by name, in JSON, at once; it did
        # nothing, so it is marked for the SDK to resend (core/pg/backend/base.py)
        sent = time.monotonic()
        got = httpx.get(f"{base}/api/v1/runs", headers={"Authorization": "Bearer x"}, timeout=20)
        answered_in = time.monotonic() - sent
        assert (got.status_code, got.json()["error"]) == (503, "database_unavailable"), got.text
        assert got.headers.get("X-Controlplane-Draining") == "1", got.headers
        assert answered_in < 5, answered_in  # the pool's checkout timeout alone is 10 s

        path.heal()
        took, body = _becomes(base, 200, within=10)
        assert took < 5, took
        # and the API itself works again over the healed path (the request pool recovered)
        assert httpx.get(f"{base}/api/v1/runs", timeout=15).status_code == 401
    finally:
        path.cut()


def test_it_names_the_migrations_a_database_lacks(procs, tmp_path):
    """A replica started before `migrate` ran (or on an older schema) is not ready, and says why."""
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    with connection.cursor() as cur:
        cur.execute("SELECT app, name FROM django_migrations")
        rows = cur.fetchall()
    newest_runs = max(n for a, n in rows if a == "runs")
    admin = connection.get_new_connection(
        {**connection.get_connection_params(), "dbname": "postgres"}
    )
    admin.autocommit = True
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        import psycopg

        params = {**connection.get_connection_params(), "dbname": name}
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute(
                "CREATE TABLE django_migrations (app text, name text, applied timestamptz)"
            )
            with other.cursor() as cur:
                cur.executemany(
                    "INSERT INTO django_migrations VALUES (%s, %s, now())",
                    [r for r in rows if r != ("runs", newest_runs)],
                )
        port = start_redis(procs)
        url = test_database_url().rsplit("/", 1)[0] + f"/{name}"
        base, _ = start_api(
            procs, server_env(tmp_path, DATABASE_URL=url, REDIS_URL=f"redis://127.0.0.1:{port}/0")
        )
        status, body = _ready(base)
        assert status == 503, body
        assert body["checks"]["database"] == {
            "ok": False,
            "error": f"migrations not applied: runs.{newest_runs}",
            "ms": body["checks"]["database"]["ms"],
        }
    finally:
        procs.stop()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_probes_answer_json_to_any_host_and_refuse_writes(procs, tmp_path):
    port = start_redis(procs)
    base, _ = start_api(procs, server_env(tmp_path, REDIS_URL=f"redis://127.0.0.1:{port}/0"))
    # a load balancer asks by address, not by the public name in ALLOWED_HOSTS
    probe = httpx.get(f"{base}/readyz", headers={"Host": "10.0.0.7:8000"}, timeout=10)
    assert probe.status_code == 200 and probe.headers["content-type"] == "application/json"
    assert json.loads(probe.text)["status"] == "ready"
    assert httpx.post(f"{base}/healthz", timeout=5).status_code == 405


def test_every_line_of_the_api_process_is_json_under_log_format_json(procs, tmp_path):
    port = start_redis(procs)
    env = server_env(tmp_path, REDIS_URL=f"redis://127.0.0.1:{port}/0", LOG_FORMAT="json")
    base, log = start_api(procs, env)
    assert httpx.get(f"{base}/api/v1/runs", timeout=10).status_code == 401
    ready = httpx.get(f"{base}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    procs.stop({"api"})
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # raises on any line that is not JSON
    assert any("Starting server" in r["event"] for r in records), lines[:5]
    access = [r for r in records if r.get("logger") == "controlplane.access"]
    assert [(r["method"], r["path"], r["status"]) for r in access] == [("GET", "/api/v1/runs", 401)]
    assert any("drained in" in r["event"] for r in records)


def test_a_request_under_daphne_makes_a_server_span_in_the_callers_trace(procs, tmp_path):
    """opentelemetry-instrumentation-asgi: the span exists under the ASGI server and continues the
    traceparent the SDK sends; the probes make none."""
    port = start_redis(procs)
    env = server_env(
        tmp_path, REDIS_URL=f"redis://127.0.0.1:{port}/0", OTEL_ENABLED="1", OTEL_CONSOLE="1"
    )
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    base, log = start_api(procs, env)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    assert httpx.get(f"{base}/api/v1/runs", headers=headers, timeout=10).status_code == 401
    httpx.get(f"{base}/readyz", timeout=10)
    procs.stop({"api"})  # the batch processor exports at shutdown
    text = log.read_text()
    assert f'"trace_id": "0x{trace_id}"' in text, text[-3000:]
    assert '"kind": "SpanKind.SERVER"' in text
    assert "/readyz" not in text
