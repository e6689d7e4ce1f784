"""Multi-party approvals: N distinct people from named roles, in stages (in order) or any order; the
requester never counts; a person counts once; each decision names the digest; any rejection ends it;
a stage not done by its deadline times the approval out."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from core.actors import system_actor
from interventions.approvals import expire_due_approvals
from runs.conditions import ConditionError, parse_policy_spec, parse_steps_json
from runs.models import Agent, ApiToken, Approval, ApprovalDecision, HistoryEvent, Run
from runs.services.agents import set_approval_policies
from tests.conftest import Api, claim, start_run
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db

POLICY = "payments:charge 2*approver then security_responder within 1h if amount>10000"


def _person(name: str, role: str) -> Api:
    user = User.objects.create_user(name, password="pw-" + name)
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    _, secret = ApiToken.issue(kind=ApiToken.OPERATOR, name=f"{name}-token", user=user)
    return Api(Client(), secret)


def _policy(spec=POLICY):
    set_approval_policies(actor=system_actor("test"), agent="purchasing", approvals=[spec])


def _ask(worker: Api, run_id: str, amount: int, **more) -> dict:
    body = {
        "fencing_token": 1,
        "tool": "payments",
        "action": "charge",
        "args": {"amount": amount, "currency": "EUR"},
        "reason": "big",
        **more,
    }
    resp = worker.post(f"/runs/{run_id}/approvals", body)
    assert resp.status_code == 201, resp.content
    return resp.json()


def _decide(api: Api, run_id: str, approval: dict, kind: str = "approve", **options):
    return intervene(
        api, run_id, kind, "checked", options={"approval_id": approval["id"], **options}
    )


def test_the_spelling_and_the_json_shape():
    spec = parse_policy_spec(POLICY)
    assert spec.approver_role == "security_responder" and spec.multi_party
    assert [(s.stage, s.role, s.count, s.within_s, s.condition) for s in spec.steps] == [
        (0, "approver", 2, None, ""),
        (1, "security_responder", 1, 3600, "amount>10000"),
    ]
    any_order = parse_policy_spec("payments:refund amount>5 approver and incident_commander")
    assert any_order.condition == "amount>5" and [s.stage for s in any_order.steps] == [0, 0]
    classic = parse_policy_spec("payments:charge amount>200 approver")
    assert classic.steps == () and classic.approver_role == "approver"
    for bad, says in [
        ("payments:charge 2*auditor", "ROLE one of"),
        ("payments:charge 11*approver", "between 1 and 10"),
        ("payments:charge approver then", "missing"),
        ("payments:charge approver within soon", "duration"),
        ("payments:charge approver if sum(amount)>5 per 1h", "windowed"),
    ]:
        with pytest.raises(ConditionError, match=says):
            parse_policy_spec(bad)
    steps = parse_steps_json([{"role": "approver", "count": 2}, {"role": "admin", "stage": 1}])
    assert [(s.stage, s.role, s.count) for s in steps] == [(0, "approver", 2), (1, "admin", 1)]
    # a step may name a team instead of a role (tests/interventions/test_team_approvals.py)
    assert parse_steps_json([{"team": "payments"}])[0].team == "payments"
    with pytest.raises(ConditionError, match="not both"):
        parse_steps_json([{"team": "payments", "role": "approver"}])
    with pytest.raises(ConditionError, match="without gaps"):
        parse_steps_json([{"role": "approver", "stage": 2}])


def test_the_policy_round_trips_and_the_change_is_audited(agent):
    _policy()
    row = Agent.objects.get(name="purchasing").approval_policies.get()
    assert row.spec == POLICY and len(row.steps) == 2
    assert AuditEvent.objects.filter(action="agent.approval_policies").exists()


def test_two_approvers_then_a_security_responder(worker, cast):
    _policy()
    run, _ = running_run(worker)
    rid = run["id"]
    asked = _ask(worker, rid, 20000)
    assert [s["still_needed"] for s in asked["progress"]["steps"]] == [2, 1]
    april, amy, sam = _person("april2", "approver"), _person("amy", "approver"), None
    sam = Api(Client(), cast["sam"][1])
    # the security step is not open yet: sam's role fits no open step
    resp = _decide(sam, rid, asked)
    assert resp.status_code == 403, resp.content
    assert _decide(april, rid, asked).status_code == 202
    # a person counts once
    again = _decide(april, rid, asked)
    assert again.status_code == 409 and "counts once" in again.json()["detail"]
    detail = worker.get(f"/runs/{rid}").json()
    progress = detail["approvals"][0]["progress"]
    assert progress["steps"][0]["approved_by"] == ["april2"]
    assert progress["steps"][0]["still_needed"] == 1 and progress["stage"] == 0
    assert Run.objects.get(pk=rid).state == "awaiting_approval"
    resp = _decide(amy, rid, asked)
    assert (
        resp.status_code == 202
        and "still needs 1 security_responder" in resp.json()["receipt"]["delivery"]
    )
    row = Approval.objects.get(pk=asked["id"])
    assert row.status == "pending" and row.stage == 1 and row.deadline is not None
    assert _decide(sam, rid, asked).status_code == 202
    row.refresh_from_db()
    assert row.status == "approved" and Run.objects.get(pk=rid).state == "running"
    assert ApprovalDecision.objects.filter(approval=row).count() == 3
    assert HistoryEvent.objects.filter(run_id=rid, kind="approval_decided").count() == 3
    assert AuditEvent.objects.filter(action="intervention.approve", outcome="allowed").count() == 3


def test_a_small_amount_skips_the_conditional_step(worker, cast):
    _policy()
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"], 500)
    assert [s["role"] for s in asked["progress"]["steps"]] == ["approver"]
    assert _decide(_person("a1", "approver"), run["id"], asked).status_code == 202
    assert _decide(_person("a2", "approver"), run["id"], asked).status_code == 202
    assert Approval.objects.get(pk=asked["id"]).status == "approved"


def test_the_requester_never_counts_and_any_rejection_ends_it(worker, cast):
    _policy("payments:charge 2*approver")
    ian = Api(Client(), cast["ian"][1])  # an incident commander satisfies an approver step
    run = start_run(ian)
    claim(worker, run["id"])
    asked = _ask(worker, run["id"], 20000)
    own = _decide(ian, run["id"], asked)
    assert own.status_code == 403 and own.json()["error"] == "separation_of_duties"
    assert _decide(_person("a1", "approver"), run["id"], asked).status_code == 202
    resp = _decide(_person("a2", "approver"), run["id"], asked, kind="reject")
    assert resp.status_code == 202, resp.content
    row = Approval.objects.get(pk=asked["id"])
    assert row.status == "rejected" and Run.objects.get(pk=run["id"]).state == "running"
    late = _decide(_person("a3", "approver"), run["id"], asked)
    assert late.status_code == 409


def test_a_decision_on_another_digest_is_refused(worker, cast):
    _policy("payments:charge 2*approver")
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"], 20000)
    resp = _decide(_person("a1", "approver"), run["id"], asked, digest="0" * 64)
    assert resp.status_code == 409 and resp.json()["error"] == "approval_digest_changed"
    ok = _decide(_person("a2", "approver"), run["id"], asked, digest=asked["digest"])
    assert ok.status_code == 202
    assert ApprovalDecision.objects.get().digest == asked["digest"]


def test_a_stage_past_its_deadline_times_out(worker, cast):
    _policy("payments:charge approver then security_responder within 1h")
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"], 20000, deadline_s=86400)
    assert _decide(_person("a1", "approver"), run["id"], asked).status_code == 202
    row = Approval.objects.get(pk=asked["id"])
    assert row.deadline < row.overall_deadline  # the stage's hour, inside the worker's day
    expired = expire_due_approvals(
        actor=system_actor("approvals-deadline"), now=timezone.now() + timedelta(hours=2)
    )
    assert expired == [asked["id"]]
    assert Approval.objects.get(pk=asked["id"]).status == "timed_out"


@pytest.mark.django_db(transaction=True)
def test_two_approvers_racing_for_the_last_slot(postgres_only, worker, cast):
    _policy("payments:charge 2*approver")
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"], 20000)
    assert _decide(_person("first", "approver"), run["id"], asked).status_code == 202
    apis = {"b": _person("b", "approver"), "c": _person("c", "approver")}
    barrier, results = threading.Barrier(2), {}

    def decide(name):
        try:
            barrier.wait()
            results[name] = _decide(apis[name], run["id"], asked)
        finally:
            connection.close()  # each thread had its own PostgreSQL connection

    threads = [threading.Thread(target=decide, args=(n,)) for n in apis]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results.values()) == [202, 409], {
        k: r.content for k, r in results.items()
    }
    row = Approval.objects.get(pk=asked["id"])
    assert row.status == "approved"
    assert ApprovalDecision.objects.filter(approval=row, decision="approved").count() == 2
    assert HistoryEvent.objects.filter(run_id=run["id"], kind="approval_decided").count() == 2


def test_the_console_shows_who_approved_and_who_is_still_needed(worker, cast, client):
    _policy()
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"], 20000)
    assert _decide(_person("april2", "approver"), run["id"], asked).status_code == 202
    client.force_login(User.objects.get(username="april"))
    inbox = client.get("/approvals/").content.decode()
    assert 'data-testid="approval-progress"' in inbox
    assert "approved by april2; still needed: 1" in inbox
    assert "1 × security_responder (if amount&gt;10000)" in inbox
    page = client.get(f"/runs/{run['id']}/").content.decode()
    assert "approved by april2; still needed: 1" in page
    # The approve dialog's preview card shows the same progress before the person decides.
    dialog = client.get(
        f"/runs/{run['id']}/interventions/new/",
        {"kind": "approve", "approval_id": asked["id"]},
        HTTP_HX_REQUEST="true",
    ).content.decode()
    assert 'data-testid="preview-progress"' in dialog, dialog[:2000]
    assert "approved by april2; still needed: 1" in dialog
