"""A run that moved on supersedes the approvals it was waiting for: superseded (audited), never
approvable, gone from the inbox. The inbox shows each decision once, with sensitive args masked."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from core.actors import system_actor
from runs.models import Approval, HistoryEvent, Run
from runs.services.lifecycle import expire_leases
from tests.conftest import Api, claim, start_run
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"
ARGS = {"amount": 5000, "currency": "EUR", "card": CARD}


def _ask(worker: Api, run_id: str, token: int = 1) -> str:
    body = {"fencing_token": token, "tool": "payments", "action": "charge", "args": ARGS}
    resp = worker.post(f"/runs/{run_id}/approvals", body)
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def _inbox(username: str = "april") -> str:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    resp = client.get("/approvals/")
    assert resp.status_code == 200
    return resp.content.decode()


def _assert_superseded(approval_id: str, as_user) -> None:
    row = Approval.objects.get(pk=approval_id)
    assert row.status == "superseded" and row.decided_by_id is None
    audit = AuditEvent.objects.get(action="approval.superseded", object_id=approval_id)
    assert audit.context["status"] == "superseded"
    assert HistoryEvent.objects.filter(run_id=row.run_id, kind="approval_superseded").exists()
    resp = intervene(
        as_user("april"), str(row.run_id), "approve", "ok", options={"approval_id": approval_id}
    )
    assert resp.status_code == 409, resp.content
    assert Approval.objects.get(pk=approval_id).status == "superseded"
    assert approval_id not in _inbox()


def test_cancel_supersedes_the_pending_approval(worker, as_user):
    run, _ = running_run(worker)
    approval_id = _ask(worker, run["id"])
    assert approval_id in _inbox()
    assert intervene(as_user("otto"), run["id"], "cancel").status_code == 202
    _assert_superseded(approval_id, as_user)


def test_a_failed_attempt_and_its_retry_supersede_and_the_new_request_is_the_only_one(
    worker, as_user
):
    run, _ = running_run(worker)
    old = _ask(worker, run["id"])
    worker.post(f"/runs/{run['id']}/finish", {"fencing_token": 1, "outcome": "failed"})
    assert intervene(as_user("otto"), run["id"], "retry").status_code == 202
    _assert_superseded(old, as_user)
    Run.objects.filter(pk=run["id"]).update(claimable_after=None)  # skip the retry backoff
    claim(worker, run["id"], worker_name="worker-8")
    new = _ask(worker, run["id"], token=2)
    html = _inbox()
    assert new in html and old not in html
    assert Approval.objects.filter(run_id=run["id"], status="pending").count() == 1


def test_an_orphaned_run_supersedes_before_recovery(worker, as_user):
    run, _ = running_run(worker)
    approval_id = _ask(worker, run["id"])
    expire_leases(actor=system_actor("test"), now=timezone.now() + timedelta(hours=1))
    _assert_superseded(approval_id, as_user)


def test_the_inbox_and_the_preview_mask_the_card_number(worker, as_user):
    run, _ = running_run(worker)
    approval_id = _ask(worker, run["id"])
    html = _inbox()
    assert CARD not in html and "••••1111" in html
    preview = as_user("april").post(
        f"/runs/{run['id']}/interventions/preview",
        {"kind": "approve", "reason": "look", "options": {"approval_id": approval_id}},
    )
    assert preview.status_code == 200, preview.content
    assert preview.json()["shown"]["args"]["card"] == "••••1111"
    assert Approval.objects.get(pk=approval_id).args["card"] == CARD  # stored as sent


def test_a_second_run_request_for_the_same_decision_shows_once(worker, as_user):
    run = start_run(worker)
    claim(worker, run["id"])
    _ask(worker, run["id"])
    twin = Approval.objects.get(run_id=run["id"])
    twin.pk = None  # the same decision recorded twice (e.g. by an older server): shown once
    twin.save()
    assert _inbox().count(f"/runs/{run['id']}/interventions/new/?kind=approve") == 1
