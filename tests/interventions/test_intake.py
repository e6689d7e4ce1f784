"""Hold intake / release intake (interventions/intake.py): new runs of a scope are accepted and
queued but not claimed; the queue is visible with its age; release is one action; both audited."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import AuditEvent
from core.roles import PERMISSIONS, ROLES
from runs.models import Agent, IntakeHold, Run
from tests.conftest import ROLE_USERS, start_run

pytestmark = pytest.mark.django_db


def _hold(api, scope="agent", target="purchasing", reason="card processor flapping"):
    shown = api.post("/intake/holds/preview", {"scope": scope, "target": target})
    assert shown.status_code == 200, shown.content
    resp = api.post(
        "/intake/holds",
        {
            "scope": scope,
            "target": target,
            "reason": reason,
            "preview_digest": shown.json()["digest"],
        },
    )
    return shown.json(), resp


def test_a_held_agent_accepts_and_queues_runs_but_no_worker_claims_them(worker, as_user):
    ian = as_user("ian")
    before = start_run(worker)
    shown, resp = _hold(ian)
    assert shown["queued"]["count"] == 1 and shown["queued"]["runs"][0]["id"] == before["id"]
    assert resp.status_code == 202, resp.content
    hold = resp.json()
    assert hold["live"] and hold["held_by"] == "ian" and hold["receipt"]["queued_at_hold"] == 1
    after = start_run(worker)  # accepted: 201, queued
    assert Run.objects.get(pk=after["id"]).state == "queued"

    assert worker.post("/work/claim", {"worker": "w1"}).json() == {"claim": None}
    refused = worker.post(f"/runs/{after['id']}/claim", {"worker": "w1"})
    assert refused.status_code == 409
    body = refused.json()
    assert body["error"] == "not_claimable" and body["intake_hold"] == hold["id"]
    assert "held for agent purchasing by ian: card processor flapping" in body["detail"]

    seen = ian.get("/intake").json()
    assert [r["id"] for r in seen["queued"]["runs"]] == [before["id"], after["id"]]  # oldest first
    assert seen["queued"]["oldest_age_s"] >= seen["queued"]["runs"][1]["age_s"] >= 0
    assert seen["holds"][0]["queued"]["count"] == 2

    rel_preview = ian.post(f"/intake/holds/{hold['id']}/release/preview").json()
    assert rel_preview["queued"]["count"] == 2
    released = ian.post(
        f"/intake/holds/{hold['id']}/release",
        {"reason": "processor stable", "preview_digest": rel_preview["digest"]},
    )
    assert released.status_code == 200, released.content
    assert released.json()["receipt"]["release"]["released_runs"] == 2
    claimed = worker.post("/work/claim", {"worker": "w1"}).json()["claim"]
    assert claimed["run_id"] == before["id"]  # oldest first again
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"intervention.hold_intake", "intervention.release_intake"} <= actions


def test_a_tool_hold_covers_runs_granted_that_tool_only(worker, as_user):
    paying = start_run(worker)  # granted payments:charge
    browsing = start_run(worker, authority=[{"scope": "inventory:*", "ttl_s": 3600}])
    _, resp = _hold(as_user("ian"), scope="tool", target="payments")
    assert resp.status_code == 202, resp.content
    assert worker.post(f"/runs/{paying['id']}/claim", {"worker": "w"}).status_code == 409
    assert worker.post(f"/runs/{browsing['id']}/claim", {"worker": "w"}).status_code == 200


def test_a_hold_of_everything_covers_every_agent(worker, as_user):
    Agent.objects.create(name="support", allowed_scopes=["email:*"])
    run = start_run(worker)
    _, resp = _hold(as_user("ada"), scope="all", target="")
    assert resp.status_code == 202, resp.content
    assert worker.post(f"/runs/{run['id']}/claim", {"worker": "w"}).status_code == 409
    assert as_user("ada").get("/intake").json()["holds"][0]["covers"] == "every agent"


def test_running_runs_are_not_touched_and_the_preview_says_so(worker, as_user):
    run = start_run(worker)
    worker.post(f"/runs/{run['id']}/claim", {"worker": "w"})
    shown, resp = _hold(as_user("ian"))
    assert shown["started_runs"] == 1 and "not touched" in shown["continues"]
    assert Run.objects.get(pk=run["id"]).state == "running"


def test_holding_a_held_scope_is_refused_and_a_stale_preview_too(worker, as_user):
    ian = as_user("ian")
    shown = ian.post("/intake/holds/preview", {"scope": "agent", "target": "purchasing"}).json()
    assert _hold(ian)[1].status_code == 202
    again = _hold(ian)[1]
    assert again.status_code == 409 and "already held" in again.json()["detail"]
    stale = ian.post(
        "/intake/holds",
        {
            "scope": "agent",
            "target": "purchasing",
            "reason": "x",
            "preview_digest": shown["digest"],
        },
    )
    assert stale.status_code == 409 and stale.json()["error"] == "preview_stale"
    hold = IntakeHold.objects.get()
    ian.post(f"/intake/holds/{hold.pk}/release", {"reason": "ok"})
    twice = ian.post(f"/intake/holds/{hold.pk}/release", {"reason": "ok"})
    assert twice.status_code == 409 and "released already" in twice.json()["detail"]


def test_roles_outside_the_row_are_refused_and_the_denial_audited(worker, as_user):
    for who in ("vera", "otto"):
        resp = as_user(who).post(
            "/intake/holds", {"scope": "agent", "target": "purchasing", "reason": "x"}
        )
        assert resp.status_code == 403, (who, resp.content)
    assert (
        AuditEvent.objects.filter(action="intervention.hold_intake", outcome="denied").count() == 2
    )
    assert not IntakeHold.objects.exists()


def test_bad_input_is_a_4xx_naming_the_field(agent, as_user):
    ian = as_user("ian")
    bad_scope = ian.post("/intake/holds", {"scope": "planet", "target": "x", "reason": "r"})
    assert bad_scope.status_code == 422 and "scope" in bad_scope.content.decode()
    unknown = ian.post("/intake/holds", {"scope": "agent", "target": "nobody", "reason": "r"})
    assert unknown.status_code == 422 and unknown.json()["field"] == "target"
    no_target = ian.post("/intake/holds", {"scope": "tool", "target": "", "reason": "r"})
    assert no_target.status_code == 422 and no_target.json()["field"] == "target"
    no_reason = ian.post("/intake/holds", {"scope": "all", "reason": ""})
    assert no_reason.status_code == 422


def test_the_console_holds_shows_the_queue_with_its_age_and_releases(worker, cast):
    run = start_run(worker)
    client = Client()
    client.force_login(cast["ian"][0])
    shown = client.post("/intake/preview/", {"scope": "agent", "target": "purchasing"})
    assert shown.status_code == 200 and b"Hold intake for agent purchasing?" in shown.content
    digest = shown.context["hold_shown"]["digest"]
    held = client.post(
        "/intake/hold/",
        {"scope": "agent", "target": "purchasing", "digest": digest, "reason": "incident 7"},
    )
    assert held.status_code == 202 and b"Intake held for" in held.content
    page = client.get("/intake/").content.decode()
    assert run["id"][:8] in page and 'class="age"' in page and "incident 7" in page
    hold = IntakeHold.objects.get()
    preview = client.post(f"/intake/{hold.pk}/release/preview/")
    released = client.post(
        f"/intake/{hold.pk}/release/",
        {"digest": preview.context["release_shown"]["digest"], "reason": "over"},
    )
    assert released.status_code == 200 and b"Intake released for" in released.content
    assert not IntakeHold.objects.filter(released_at__isnull=True).exists()


def test_a_viewer_sees_the_page_without_the_hold_form(agent, cast):
    client = Client()
    client.force_login(cast["vera"][0])
    page = client.get("/intake/").content.decode()
    assert 'id="intake-holds"' in page and 'id="intake-hold-form"' not in page
    assert client.post("/intake/hold/", {"scope": "all", "reason": "x"}).status_code == 403


@pytest.mark.parametrize("role", ROLES)
def test_the_permission_rows_for_every_role(role, agent, as_user):
    """hold_intake and release_intake across every role: refused (403, audited) outside the row."""
    username = {r: n for n, r in reversed(list(ROLE_USERS.items()))}[role]
    api = as_user(username)
    held = api.post("/intake/holds", {"scope": "all", "reason": f"{username} holds"})
    hold = IntakeHold.objects.filter(released_at__isnull=True).first()
    if role in PERMISSIONS["hold_intake"]:
        assert held.status_code == 202, held.content
    else:
        assert held.status_code == 403 and held.json()["error"] == "forbidden"
        assert AuditEvent.objects.filter(
            action="intervention.hold_intake", actor=username, outcome="denied"
        ).exists()
        hold = IntakeHold.objects.create(scope="all", reason="set by the test", held_by="ian")
    released = api.post(f"/intake/holds/{hold.pk}/release", {"reason": "over"})
    if role in PERMISSIONS["release_intake"]:
        assert released.status_code == 200, released.content
    else:
        assert released.status_code == 403 and released.json()["error"] == "forbidden"
        assert IntakeHold.objects.get(pk=hold.pk).live


def test_both_are_on_the_contracts_page_and_in_the_contracts_document(cast, as_user):
    client = Client()
    client.force_login(cast["vera"][0])
    html = client.get("/contracts/").content.decode()
    assert 'id="contract-hold_intake"' in html and 'id="contract-release_intake"' in html
    doc = as_user("vera").get("/contracts").json()
    assert doc["fleet_contracts"]["hold_intake"]["may_issue"] == sorted(PERMISSIONS["hold_intake"])
    assert "hold_intake" in doc["permissions"] and "release_intake" in doc["permissions"]
