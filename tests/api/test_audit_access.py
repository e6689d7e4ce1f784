"""Who reads which audit events (core.roles "audit_read_all"; docs/security/hardening.md, "Audit
reads"): incident commanders, security responders and admins read the whole log; every other role
reads the events of runs. A request that names events of no run is refused (403) and the refusal is
audited, in the API and in the console alike; so are export and verification without their right."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import system_actor
from tests.conftest import start_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def trail(worker):
    run = start_run(worker)
    record_audit(
        actor=system_actor("test"),
        action="token.issue",
        object_type="token",
        object_id="t-1",
        context={"name": "ops-token"},
    )
    return run


def browser(name: str) -> Client:
    client = Client()
    assert client.login(username=name, password=f"pw-{name}")
    return client


def denials(actor: str, action: str) -> int:
    return AuditEvent.objects.filter(
        action=action, actor__contains=actor, outcome=AuditEvent.DENIED
    ).count()


@pytest.mark.parametrize("name", ["vera", "otto", "april"])
def test_a_role_without_audit_read_all_reads_runs_events_and_is_refused_the_rest(
    trail, as_user, name
):
    api = as_user(name)
    listed = api.get("/audit", limit=1000).json()
    assert listed["scope"] == "runs" and listed["events"]
    assert all(e["run_id"] for e in listed["events"])
    assert api.get("/audit", object_type="run").status_code == 200
    for ask in ({"object_type": "token"}, {"action": "token"}, {"action": "token.issue"}):
        refused = api.get("/audit", **ask)
        assert refused.status_code == 403, (ask, refused.content)
        assert "audit_read_all" in refused.json()["detail"]
    assert denials(name, "api.denied") == 3
    assert api.get("/audit/verify").status_code == 403
    assert api.get("/audit", object_type="nothing-like-it").json()["events"] == []

    page = browser(name)
    assert page.get("/audit/").status_code == 200
    assert b'data-testid="audit-scope"' in page.get("/audit/").content
    assert page.get("/audit/", {"object_type": "token"}).status_code == 403
    assert page.get("/audit/export.jsonl").status_code == 403
    assert page.get("/audit/verify/").status_code == 403
    assert denials(name, "console.denied") == 3


@pytest.mark.parametrize("name", ["ian", "sam", "ada"])
def test_the_roles_that_answer_for_the_trail_read_the_whole_log(trail, as_user, name):
    api = as_user(name)
    whole = api.get("/audit", object_type="token").json()
    assert whole["scope"] == "all" and [e["object_id"] for e in whole["events"]] == ["t-1"]
    page = browser(name)
    listed = page.get("/audit/", {"object_type": "token"})
    assert listed.status_code == 200 and b"token.issue" in listed.content
    assert b'data-testid="audit-scope"' not in listed.content
    export = page.get("/audit/export.jsonl")
    assert export.status_code == 200
    assert b"token.issue" in b"".join(export.streaming_content)
    assert not AuditEvent.objects.filter(outcome=AuditEvent.DENIED).exists()
