"""Approve / reject: the planned boundary. Decided by a permitted role, never by whoever asked; bound
to the exact action by digest and single-use; a passed deadline is timed_out, never a rejection."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from interventions.approvals import expire_approvals
from runs.models import Approval, HistoryEvent, Run
from tests.conftest import Api, claim, declare, start_run
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db

BIG = {"amount": 5000, "currency": "EUR"}


def _ask(worker: Api, run_id: str, token: int = 1, **overrides) -> dict:
    body = {
        "fencing_token": token,
        "tool": "payments",
        "action": "charge",
        "args": BIG,
        "reason": "over the limit",
    }
    body.update(overrides)
    resp = worker.post(f"/runs/{run_id}/approvals", body)
    assert resp.status_code == 201, resp.content
    return resp.json()


def _decide(
    api: Api, run_id: str, kind: str, approval_id: str, reason: str = "checked with the customer"
):
    return intervene(api, run_id, kind, reason, options={"approval_id": approval_id})


def test_approval_is_bound_to_the_digest_and_single_use(worker, as_user):
    run, c = running_run(worker)
    rid = run["id"]
    approval = _ask(worker, rid)
    assert Run.objects.get(pk=rid).state == "awaiting_approval"
    resp = _decide(as_user("april"), rid, "approve", approval["id"])
    assert resp.status_code == 202, resp.content
    receipt = resp.json()["receipt"]
    assert receipt["state"] == "running" and receipt["approval"]["decided_by"] == "april"
    row = Approval.objects.select_related("decided_by").get(pk=approval["id"])
    assert (
        row.status == "approved"
        and row.decided_by.username == "april"
        and row.decided_at is not None
    )
    assert row.decision_reason == "checked with the customer"
    assert {k: row.shown[k] for k in ("tool", "action", "args", "digest", "run_goal")} == {
        "tool": "payments",
        "action": "charge",
        "args": BIG,
        "digest": approval["digest"],
        "run_goal": "buy 2 of sku-1",
    }
    # The worker learns the decision on its next heartbeat.
    beat = worker.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 1}).json()
    assert beat["directive"] == "continue" and beat["approval"]["status"] == "approved"
    assert beat["approval"]["digest"] == approval["digest"]

    uncited = declare(worker, rid, 1, key="big-0", args=BIG)
    assert uncited.status_code == 409 and uncited.json()["reason"] == "approval_required"
    other = declare(
        worker, rid, 1, key="big-1", args={**BIG, "amount": 9000}, approval_id=approval["id"]
    )
    assert other.status_code == 409 and other.json()["reason"] == "approval_mismatch"
    exact = declare(worker, rid, 1, key="big-2", args=BIG, approval_id=approval["id"])
    assert exact.status_code == 201 and exact.json()["decision"] == "authorized", exact.content
    reuse = declare(worker, rid, 1, key="big-3", args=BIG, approval_id=approval["id"])
    assert reuse.status_code == 409 and reuse.json()["reason"] == "approval_already_used"
    assert str(Approval.objects.get(pk=approval["id"]).consumed_by_id) == exact.json()["id"]
    assert HistoryEvent.objects.filter(
        run_id=rid, kind="approval_decided", data__decision="approved"
    ).exists()


def test_reject_reaches_the_worker_and_the_approval_cannot_be_used(worker, as_user):
    run, c = running_run(worker)
    approval = _ask(worker, run["id"])
    resp = _decide(as_user("april"), run["id"], "reject", approval["id"], reason="amount is wrong")
    assert resp.status_code == 202, resp.content
    assert Approval.objects.get(pk=approval["id"]).status == "rejected"
    beat = worker.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 1}).json()
    assert (
        beat["approval"]["status"] == "rejected"
        and beat["approval"]["decision_reason"] == "amount is wrong"
    )
    cited = declare(worker, run["id"], 1, key="big-1", args=BIG, approval_id=approval["id"])
    assert cited.status_code == 409 and cited.json()["reason"] == "approval_not_granted"
    assert AuditEvent.objects.filter(action="run.reject", run_id=run["id"], actor="april").exists()


def test_the_requester_can_never_approve_their_own_request(worker, as_user, cast):
    ian = as_user("ian")
    run = start_run(ian)  # the incident commander started this run himself
    claim(worker, run["id"])
    approval = _ask(worker, run["id"])
    mine = _decide(ian, run["id"], "approve", approval["id"])
    assert mine.status_code == 403 and mine.json()["error"] == "separation_of_duties", mine.content
    assert AuditEvent.objects.filter(
        action="intervention.approve", actor="ian", outcome="denied"
    ).exists()
    assert Approval.objects.get(pk=approval["id"]).status == "pending"
    assert _decide(as_user("april"), run["id"], "approve", approval["id"]).status_code == 202


def test_the_approvals_required_role_is_enforced(worker, as_user):
    run, _ = running_run(worker)
    approval = _ask(worker, run["id"], required_role="incident_commander")
    low = _decide(as_user("april"), run["id"], "approve", approval["id"])
    assert low.status_code == 403 and low.json()["required_role"] == "incident_commander"
    assert _decide(as_user("ian"), run["id"], "approve", approval["id"]).status_code == 202


def test_an_approval_is_decided_once(worker, as_user):
    run, _ = running_run(worker)
    approval = _ask(worker, run["id"])
    assert _decide(as_user("april"), run["id"], "approve", approval["id"]).status_code == 202
    again = _decide(as_user("ian"), run["id"], "reject", approval["id"])
    assert again.status_code == 409 and again.json()["state"] == "running"
    assert Approval.objects.get(pk=approval["id"]).status == "approved"


def test_an_unknown_or_foreign_approval_is_refused(worker, as_user):
    run, _ = running_run(worker)
    _ask(worker, run["id"])
    other, _ = running_run(worker)
    foreign = _ask(worker, other["id"])
    april = as_user("april")
    assert _decide(april, run["id"], "approve", foreign["id"]).status_code == 404
    assert _decide(april, run["id"], "approve", "not-a-uuid").status_code == 422
    assert intervene(april, run["id"], "approve", "x").status_code == 422


def test_timed_out_is_not_rejected_and_escalates(worker, as_user):
    run, c = running_run(worker)
    approval = _ask(worker, run["id"], deadline_s=60)
    Approval.objects.filter(pk=approval["id"]).update(
        deadline=timezone.now() - timedelta(seconds=1)
    )
    assert expire_approvals() == [approval["id"]]
    row = Approval.objects.get(pk=approval["id"])
    assert row.status == "timed_out" and row.decided_by_id is None
    assert Run.objects.get(pk=run["id"]).state == "running"
    esc = AuditEvent.objects.get(action="approval.escalated", object_id=approval["id"])
    assert esc.actor_kind == "system" and esc.context["escalated_to"] == "incident_commander"
    kinds = list(HistoryEvent.objects.filter(run_id=run["id"]).values_list("kind", flat=True))
    assert (
        "approval_timed_out" in kinds
        and "approval_escalated" in kinds
        and "approval_decided" not in kinds
    )
    assert not AuditEvent.objects.filter(action__in=["run.reject", "intervention.reject"]).exists()
    beat = worker.post(f"/leases/{c['lease']['id']}/heartbeat", {"fencing_token": 1}).json()
    assert beat["approval"]["status"] == "timed_out"
    assert expire_approvals() == []  # idempotent
    late = _decide(as_user("april"), run["id"], "approve", approval["id"])
    assert late.status_code == 409


def test_a_pending_approval_before_its_deadline_is_left_alone(worker):
    run, _ = running_run(worker)
    approval = _ask(worker, run["id"], deadline_s=600)
    assert expire_approvals() == []
    assert Approval.objects.get(pk=approval["id"]).status == "pending"


def test_preview_shows_the_approver_exactly_what_they_decide(worker, as_user):
    run, _ = running_run(worker)
    approval = _ask(worker, run["id"])
    resp = as_user("april").post(
        f"/runs/{run['id']}/interventions/preview",
        {"kind": "approve", "reason": "x", "options": {"approval_id": approval["id"]}},
    )
    assert resp.status_code == 200, resp.content
    shown = resp.json()["shown"]
    assert (shown["tool"], shown["action"], shown["args"], shown["digest"]) == (
        "payments",
        "charge",
        BIG,
        approval["digest"],
    )
    assert resp.json()["next_state"] == "running"
    assert Approval.objects.get(pk=approval["id"]).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_two_deciders_at_once_exactly_one_decision_is_recorded(postgres_only, worker, as_user):
    run, _ = running_run(worker)
    approval = _ask(worker, run["id"])
    apis = {"approve": as_user("april"), "reject": as_user("ian")}
    barrier, results = threading.Barrier(2), {}

    def decide(kind):
        try:
            barrier.wait()
            results[kind] = _decide(apis[kind], run["id"], kind, approval["id"])
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(k,)) for k in apis]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results.values()) == [202, 409], {
        k: r.content for k, r in results.items()
    }
    winner = next(k for k, r in results.items() if r.status_code == 202)
    assert (
        Approval.objects.get(pk=approval["id"]).status
        == {"approve": "approved", "reject": "rejected"}[winner]
    )
    assert HistoryEvent.objects.filter(run_id=run["id"], kind="approval_decided").count() == 1
    assert (
        AuditEvent.objects.filter(
            action__in=["intervention.approve", "intervention.reject"], outcome="denied"
        ).count()
        == 1
    )
