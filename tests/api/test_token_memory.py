"""A worker token is read once per API_TOKEN_CACHE_S per process (core/tokens.py), and a revoked
token is refused within that bound: at once where it was revoked, and by any process after the bound
however it was revoked."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from core import tokens
from runs.models import ApiToken
from tests.conftest import Api

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(monkeypatch):
    """core.tokens' monotonic clock, moved by hand."""
    now = [1000.0]
    monkeypatch.setattr(tokens.time, "monotonic", lambda: now[0])
    import api.auth

    monkeypatch.setattr(api.auth.time, "monotonic", lambda: now[0])
    return now


def test_a_worker_token_is_read_once_within_the_bound(worker, worker_token, clock, settings):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.API_TOKEN_CACHE_S = 2
    assert worker.get("/runs").status_code == 200
    with CaptureQueriesContext(connection) as queries:
        assert worker.get("/runs").status_code == 200
    assert not [q for q in queries if "api_token" in q["sql"] or "apitoken" in q["sql"]]
    clock[0] += 2.0  # past the bound: read again
    with CaptureQueriesContext(connection) as queries:
        assert worker.get("/runs").status_code == 200
    assert [q for q in queries if "apitoken" in q["sql"]]


def test_revoked_elsewhere_is_refused_once_the_bound_passes(worker, worker_token, clock, settings):
    """Revoked behind this process's back (raw SQL, another process): still accepted within the bound
    (that is the trade), refused from the bound on."""
    settings.API_TOKEN_CACHE_S = 2
    assert worker.get("/runs").status_code == 200
    ApiToken.objects.update(revoked_at=timezone.now())
    clock[0] += 1.9
    assert worker.get("/runs").status_code == 200
    clock[0] += 0.1
    resp = worker.get("/runs")
    assert resp.status_code == 401 and resp.json()["error"] == "unauthenticated"


def test_revoked_by_the_service_is_refused_at_once(worker, worker_token, clock):
    assert worker.get("/runs").status_code == 200
    call_command("revoke_token", worker_token[: ApiToken.PREFIX_LEN], stdout=io.StringIO())
    assert worker.get("/runs").status_code == 401  # no time passed


def test_a_read_that_raced_a_revocation_is_not_remembered(worker_token, clock):
    """A call that read the row before the revocation (another thread) must not keep it afterwards."""
    since = tokens.generation()
    row = ApiToken.objects.get(token_hash=ApiToken.hash_secret(worker_token))
    tokens.forget_revoked(row.token_hash)  # the revocation lands between the read and remember
    known = tokens.KnownToken(row.pk, row.name, (), None, tokens.time.monotonic())
    tokens.remember(row.token_hash, known, since)
    assert tokens.recall(row.token_hash) is None


def test_zero_turns_the_memory_off(worker, worker_token, clock, settings):
    settings.API_TOKEN_CACHE_S = 0
    assert worker.get("/runs").status_code == 200
    ApiToken.objects.update(revoked_at=timezone.now())
    assert worker.get("/runs").status_code == 401


def test_operator_tokens_are_read_on_every_call(cast, clock):
    user, secret = cast["otto"]
    otto = Api(Client(), secret)
    assert otto.get("/runs").status_code == 200
    user.is_active = False
    user.save()
    assert otto.get("/runs").status_code == 401
