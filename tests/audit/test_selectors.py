"""One audit filter (audit.selectors.audit_events) behind the console's audit page and the API: the
same filters give the same events on both edges."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from audit.selectors import audit_events
from audit.services import record_audit
from core.actors import Actor
from tests.conftest import Api

pytestmark = pytest.mark.django_db

RUN = uuid.uuid4()


def _write(actor: str, action: str, component: str = "api", run_id=None) -> int:
    who = Actor(kind="user", name=actor, component=component)
    return record_audit(
        actor=who, action=action, object_type="run", object_id="x", run_id=run_id
    ).seq


@pytest.fixture
def trail() -> dict[str, int]:
    return {
        "pause": _write("otto", "intervention.pause", run_id=RUN),
        "cancel": _write("olga", "intervention.cancel", component="console"),
        "claim": _write("otto", "run.claim", run_id=RUN),
        "claimed": _write("otto", "run.claimed_twice"),
        "plural": _write("otto", "interventions.other"),
    }


def _seqs(**filters) -> list[int]:
    return sorted(audit_events(**filters).values_list("seq", flat=True))


def test_action_names_an_action_or_its_family(trail):
    assert _seqs(action="intervention") == [trail["pause"], trail["cancel"]]
    assert _seqs(action="intervention.") == [trail["pause"], trail["cancel"]]
    assert _seqs(action="run.claim") == [trail["claim"]]  # not run.claimed_twice


def test_actor_component_and_run_filters(trail):
    assert _seqs(actor="OTT", action="intervention") == [trail["pause"]]
    assert _seqs(component="console") == [trail["cancel"]]
    assert _seqs(run_id=str(RUN)) == [trail["pause"], trail["claim"]]
    assert _seqs(run_id="not-a-uuid") == []
    assert _seqs(after_seq=trail["claim"]) == [trail["claimed"], trail["plural"]]
    assert _seqs(before_seq=trail["cancel"]) == [trail["pause"]]


def test_console_and_api_return_the_same_events_for_the_same_filters(trail, cast):
    filters = {"action": "intervention", "actor": "ot"}
    expected = _seqs(**filters)
    assert expected == [trail["pause"]]
    api = Api(Client(), cast["vera"][1]).get("/audit", **filters)
    assert api.status_code == 200
    assert [e["seq"] for e in api.json()["events"]] == expected
    page = Client()
    page.force_login(cast["vera"][0])
    resp = page.get("/audit/", filters, HTTP_HX_REQUEST="true")
    assert resp.status_code == 200
    assert sorted(row["a"].seq for row in resp.context["events"]) == expected
