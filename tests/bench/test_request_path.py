"""bench.request_path: its loop drives the real ASGI app through a run and reports every figure."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from bench import harness, request_path

pytestmark = pytest.mark.django_db(transaction=True)


def test_tiny_request_path_run_reports_cpu_and_statements(settings):
    from controlplane.asgi import django_asgi_app
    from runs.models import Agent, ApiToken

    settings.ROOT_URLCONF = "bench.urls"
    Agent.objects.create(name=harness.AGENT, allowed_scopes=harness.SCOPES)
    _, secret = ApiToken.issue(kind=ApiToken.WORKER, name="rp", agents=[harness.AGENT])
    caller = request_path.Caller(django_asgi_app, secret)
    result = async_to_sync(request_path.measure)(caller, 1, 3, 1, 2, None)
    median = result["median"]
    assert median["cpu_ms_per_effect"] > 0 and median["cpu_ms_per_outcome_call"] > 0
    assert median["floor_noop_cpu_ms"] > 0 and median["floor_echo_cpu_ms"] > 0
    assert "statements_per_effect" in median  # 0 unless bench/sqlcount.py is installed
