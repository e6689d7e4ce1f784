"""Cancel never escalates; terminate is its own contract; a stale preview is refused naming what moved.

A second plain cancel of a cancelling run is a 409 naming the cancel under way (the same actor's same
request gets the original receipt, 200). Terminate (incident commander, admin) stops waiting for the
worker: the lease ends now, the in-flight effects its preview named become unknown. An intervention
carries the preview digest it was decided on."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import AuditEvent
from audit.services import verify_chain
from interventions.models import Intervention
from runs.models import Effect, ExecutionLease, Run
from tests.conftest import Api, declare
from tests.interventions.helpers import intervene, running_run
from tests.interventions.test_races import _run_in_threads


def _preview(api, run_id, kind, reason="on-call decision", **body):
    resp = api.post(
        f"/runs/{run_id}/interventions/preview", {"kind": kind, "reason": reason, **body}
    )
    assert resp.status_code == 200, resp.content
    return resp.json()


@pytest.mark.django_db
def test_terminate_names_what_becomes_unknown_and_makes_it_so(worker, as_user):
    run, c = running_run(worker)
    token = c["lease"]["fencing_token"]
    flying = declare(worker, run["id"], token, key="k-charge").json()
    otto, ian = as_user("otto"), as_user("ian")
    assert intervene(otto, run["id"], "cancel", "customer withdrew").status_code == 202
    assert (
        intervene(otto, run["id"], "terminate", "worker stuck").status_code == 403
    )  # its own right
    assert AuditEvent.objects.filter(action="intervention.terminate", outcome="denied").exists()

    shown = _preview(ian, run["id"], "terminate", "worker stuck")
    assert shown["next_state"] == "cancelled" and shown["blocked_by"] == []
    assert [e["id"] for e in shown["become_unknown"]] == [flying["id"]]
    assert "reconcile" in shown["become_unknown"][0]["note"]
    assert shown["cancel_under_way"]["issued_by"] == "user:otto"
    assert shown["lease"]["fencing_token"] == token
    resp = intervene(ian, run["id"], "terminate", "worker stuck", preview_digest=shown["digest"])
    assert resp.status_code == 202, resp.content
    receipt = resp.json()["receipt"]
    assert receipt["state"] == "cancelled" and receipt["must_reconcile"] == [flying["id"]]
    assert receipt["decided_on_preview"] == shown["digest"]
    assert Effect.objects.get(pk=flying["id"]).status == "unknown"
    assert ExecutionLease.objects.get(run_id=run["id"]).status == "expired"
    assert AuditEvent.objects.filter(action="effect.unknown", object_id=flying["id"]).exists()
    assert (
        AuditEvent.objects.filter(action="intervention.terminate", outcome="allowed").count() == 1
    )
    # the worker's late outcome is still recorded (a fact about the world), flagged stale
    late = worker.post(
        f"/effects/{flying['id']}/outcome", {"fencing_token": token, "status": "committed"}
    )
    assert late.status_code == 200 and late.json()["stale_lease"] is True


@pytest.mark.django_db
def test_terminate_is_refused_on_a_run_not_cancelling(worker, as_user):
    run, _ = running_run(worker)
    shown = _preview(as_user("ian"), run["id"], "terminate")
    assert shown["allowed"] is False and shown["blocked_by"]
    resp = intervene(as_user("ian"), run["id"], "terminate")
    assert resp.status_code == 409 and resp.json()["state"] == "running"
    assert Run.objects.get(pk=run["id"]).state == "running"


@pytest.mark.django_db
def test_a_repeated_cancel_is_the_original_receipt_or_a_409_naming_it(worker, as_user):
    run, _ = running_run(worker)
    otto, olga = as_user("otto"), as_user("olga")
    first = intervene(otto, run["id"], "cancel", "customer withdrew")
    assert first.status_code == 202
    again = intervene(otto, run["id"], "cancel", "customer withdrew")
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"] and again.json()["replayed"] is True
    assert AuditEvent.objects.filter(action="intervention.replayed").count() == 1
    other = intervene(olga, run["id"], "cancel", "I also want it stopped")
    assert other.status_code == 409, other.content
    body = other.json()
    assert body["existing_cancel"] == {
        "intervention": first.json()["id"],
        "issued_by": "user:otto",
        "at": first.json()["created_at"],
        "reason": "customer withdrew",
    }
    assert "terminate" in body["detail"]
    assert Intervention.objects.filter(run_id=run["id"], kind="cancel").count() == 1
    assert ExecutionLease.objects.get(run_id=run["id"]).status == "active"  # never forced
    assert Run.objects.get(pk=run["id"]).state == "cancelling"


@pytest.mark.django_db
def test_a_stale_preview_is_refused_naming_the_difference(worker, as_user):
    run, _ = running_run(worker)
    otto, olga = as_user("otto"), as_user("olga")
    seen = _preview(olga, run["id"], "cancel", "smoke")
    assert seen["sections"]["state"] == "=running"
    assert intervene(otto, run["id"], "pause", "first").status_code == 202
    for body in (
        {"preview_digest": seen["digest"], "preview_sections": seen["sections"]},
        {"preview_digest": seen["digest"]},  # the preview remembered under its digest
    ):
        resp = intervene(olga, run["id"], "cancel", "smoke", **body)
        assert resp.status_code == 409 and resp.json()["error"] == "preview_stale", resp.content
        changed = {c["section"]: c for c in resp.json()["changed"]}
        assert changed["state"] == {"section": "state", "was": "running", "now": "paused"}
        assert "state was running, now paused" in resp.json()["detail"]
    assert Run.objects.get(pk=run["id"]).state == "paused"
    fresh = _preview(olga, run["id"], "cancel", "smoke")
    ok = intervene(olga, run["id"], "cancel", "smoke", preview_digest=fresh["digest"])
    assert ok.status_code == 202 and ok.json()["receipt"]["decided_on_preview"] == fresh["digest"]


# --- the race: ten cancels at once, real threads on PostgreSQL --------------------------------------


@pytest.mark.django_db(transaction=True)
def test_ten_cancels_at_once_give_one_202_and_never_a_forced_stop(worker, cast, postgres_only):
    from django.contrib.auth.models import Group, User

    from runs.models import ApiToken

    run, c = running_run(worker)
    tokens = [cast["otto"][1], cast["olga"][1], cast["ian"][1], cast["ada"][1]]
    group = Group.objects.get(name="operator")
    for i in range(4):
        user = User.objects.create_user(f"oncall-{i}")
        user.groups.add(group)
        tokens.append(ApiToken.issue(kind=ApiToken.OPERATOR, name=f"oncall-{i}", user=user)[1])
    tokens += tokens[:2]  # otto and olga press twice: the same request again
    seen = _preview(Api(Client(), tokens[0]), run["id"], "cancel", "everyone saw it running")

    def press(token: str) -> tuple[int, dict]:
        resp = intervene(
            Api(Client(), token),
            run["id"],
            "cancel",
            "everyone saw it running",
            preview_digest=seen["digest"],
            preview_sections=seen["sections"],
        )
        return resp.status_code, resp.json()

    results = [r[1] for r in _run_in_threads([lambda t=t: press(t) for t in tokens])]
    codes = sorted(r[0] for r in results)
    assert codes.count(202) == 1, codes
    winner = next(r[1] for r in results if r[0] == 202)
    for code, body in results:
        if code == 200:  # the winner's own second press: its original receipt
            assert body["id"] == winner["id"] and body["replayed"] is True
        elif code == 409:
            assert body["existing_cancel"]["intervention"] == winner["id"], body
        else:
            assert code == 202, (code, body)
    assert Run.objects.get(pk=run["id"]).state == "cancelling"
    assert ExecutionLease.objects.get(run_id=run["id"]).status == "active"
    assert Intervention.objects.filter(run_id=run["id"]).count() == 1
    assert AuditEvent.objects.filter(action="intervention.cancel", outcome="allowed").count() == 1
    assert AuditEvent.objects.filter(
        action="intervention.cancel", outcome="denied"
    ).count() == codes.count(409)
    assert not AuditEvent.objects.filter(action="intervention.terminate").exists()
    assert verify_chain().ok


@pytest.mark.django_db(transaction=True)
def test_two_terminates_at_once_one_applies(worker, cast, postgres_only):
    run, c = running_run(worker)
    declare(worker, run["id"], c["lease"]["fencing_token"], key="k-flying")
    assert intervene(Api(Client(), cast["otto"][1]), run["id"], "cancel").status_code == 202

    def press(token: str) -> tuple[int, dict]:
        resp = intervene(Api(Client(), token), run["id"], "terminate", "worker stuck")
        return resp.status_code, resp.json()

    results = [
        r[1]
        for r in _run_in_threads([lambda t=t: press(t) for t in (cast["ian"][1], cast["ada"][1])])
    ]
    assert sorted(code for code, _ in results) == [202, 409], results
    assert Run.objects.get(pk=run["id"]).state == "cancelled"
    assert Effect.objects.get(idempotency_key="k-flying").status == "unknown"
    assert AuditEvent.objects.filter(action="effect.unknown").count() == 1
    assert AuditEvent.objects.filter(action="intervention.terminate", outcome="denied").count() == 1
