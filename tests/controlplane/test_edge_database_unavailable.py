"""A console page or dialog whose database did not answer (controlplane/edge.py): a did-nothing 503
the page sends again, or a 500 that says the outcome is unknown; never Django's 500 page drawn into
a dialog. The error is a real one: psycopg refused by a closed port, wrapped as Django wraps it."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import connection
from django.db.utils import OperationalError
from django.test import RequestFactory

from controlplane.edge import InputGuardMiddleware


def _refused() -> OperationalError:
    try:
        psycopg.connect("host=127.0.0.1 port=1 connect_timeout=1 user=postgres")
    except psycopg.OperationalError as err:
        try:
            raise OperationalError(str(err)) from err
        except OperationalError as wrapped:
            return wrapped
    raise AssertionError("port 1 answered")


class _QueryFailed(psycopg.errors.DeadlockDetected):
    pass


def _guard() -> InputGuardMiddleware:
    return InputGuardMiddleware(lambda request: pytest.fail("not reached"))


@pytest.fixture
def applied(monkeypatch):
    def set_to(value: bool) -> None:
        monkeypatch.setattr(connection, "maybe_applied", value, raising=False)

    return set_to


def test_a_dialog_get_that_changed_nothing_is_a_503_the_page_sends_again(applied):
    applied(False)
    request = RequestFactory().get("/runs/x/interventions/new/?kind=pause", HTTP_HX_REQUEST="true")
    response = _guard().process_exception(request, _refused())
    assert response.status_code == 503
    assert response["X-Controlplane-Draining"] == "1"
    body = json.loads(response.content)
    assert body["error"] == "database_unavailable"
    assert "did nothing" in body["detail"]


def test_a_post_that_may_have_committed_is_a_500_saying_the_outcome_is_unknown(applied):
    applied(True)
    request = RequestFactory().post("/runs/x/interventions/", HTTP_HX_REQUEST="true")
    response = _guard().process_exception(request, _refused())
    assert response.status_code == 500
    assert not response.has_header("X-Controlplane-Draining")
    assert "whether it took effect is unknown" in json.loads(response.content)["detail"]


def test_a_page_gets_a_page_drawn_without_the_database(applied):
    """No session, no user, no template: the database just did not answer (and this test has no
    database access at all: pytest-django fails any query)."""
    applied(False)
    request = RequestFactory().get("/runs/")
    response = _guard().process_exception(request, _refused())
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert b"The database did not answer" in response.content
    assert b"did nothing" in response.content


def test_a_query_of_ours_that_failed_and_the_api_are_left_to_their_own_handlers(applied):
    applied(False)
    try:
        raise OperationalError("deadlock detected") from _QueryFailed("deadlock detected")
    except OperationalError as deadlock:
        own_failure = deadlock
    page = RequestFactory().get("/runs/", HTTP_HX_REQUEST="true")
    assert _guard().process_exception(page, own_failure) is None
    api = RequestFactory().get("/api/v1/runs")
    assert _guard().process_exception(api, _refused()) is None
    assert _guard().process_exception(page, ValueError("not the database")) is None
