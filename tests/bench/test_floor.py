"""bench.floor: the floor routes answer without the database, and the ceiling arithmetic is right."""

from __future__ import annotations

import json

import pytest

from bench import floor


@pytest.fixture
def floor_urls(settings):
    settings.ROOT_URLCONF = "bench.urls"


def test_floor_routes_do_no_database_work(client, floor_urls):
    # No django_db mark: pytest-django fails any database access in this test.
    _, path, body = floor.ROUTES["ninja_echo"]
    echo = client.post(path, data=json.dumps(body), content_type="application/json")
    noop = client.get(floor.ROUTES["django_noop"][1])
    assert echo.status_code == 200 and echo.json()["idempotency_key"] == body["idempotency_key"]
    assert noop.status_code == 200 and noop.json() == {"ok": True}


def test_echo_validates_like_a_declaration(client, floor_urls):
    _, path, body = floor.ROUTES["ninja_echo"]
    resp = client.post(
        path, data=json.dumps({**body, "fencing_token": "x"}), content_type="application/json"
    )
    assert resp.status_code == 422  # the floor pays for body validation, as declare does


def test_protocol_api_still_served_under_bench_settings(client, floor_urls):
    assert client.get("/api/v1/openapi.json").status_code == 200


def test_ceiling_from_floor():
    measured = {
        "route": "POST /bench/echo/",
        "workers": 16,
        "requests_per_s": 630.0,
        "little_mean_latency_floor_ms": round(1000 * 16 / 630.0, 1),
    }
    out = floor.ceiling(measured, calls_per_effect=3.15, target_effects_per_s=400, target_p99_ms=25)
    assert out["max_effects_per_s"] == 200.0
    assert out["effects_per_s_target_reachable"] is False
    assert out["mean_latency_floor_ms"] == 25.4 and out["p99_target_reachable"] is False
    fast = floor.ceiling(
        {**measured, "requests_per_s": 1600.0, "little_mean_latency_floor_ms": 10.0}, 3.15, 400, 25
    )
    assert fast["effects_per_s_target_reachable"] is True and fast["p99_target_reachable"] is True


def test_cpu_budget_at_target():
    measured = {
        "route": "POST /bench/echo/",
        "workers": 16,
        "requests_per_s": 433.0,
        "little_mean_latency_floor_ms": 37.0,
        "cpu": {"client_cpu_ms_per_request": 1.0, "server_cpu_ms_per_request": 3.0},
    }
    budget = floor.ceiling(measured, 3.15, 400, 25, cpu_count=2)["cpu_budget_at_target"]
    assert budget == {
        "requests_per_s_needed": 1260,
        "client_cores_needed": 1.26,
        "noop_server_cores_needed": 3.78,
        "cores_available": 2,
    }
