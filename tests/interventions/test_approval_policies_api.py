"""GET/PUT /api/v1/agents/{name}/approval-policies: admins only (manage_approval_policies), a bad
policy is a 422 naming approvals[i], every change and refusal audited with before/after."""

from __future__ import annotations

import json

import pytest

from audit.models import AuditEvent
from runs.models import ApprovalPolicy

pytestmark = pytest.mark.django_db

PATH = "/agents/purchasing/approval-policies"


def _put(api, body):
    return api.client.put(
        f"/api/v1{PATH}", data=json.dumps(body), content_type="application/json", **api.headers
    )


def test_an_admin_reads_and_replaces_the_policies_audited(agent, as_user):
    ada = as_user("ada")
    assert ada.get(PATH).json() == {"agent": "purchasing", "approvals": []}
    answer = _put(
        ada,
        {
            "approvals": [
                "payments:charge amount>200 approver",
                {
                    "approval": "payments:refund",
                    "steps": [{"role": "approver", "count": 2, "stage": 0}],
                },
            ]
        },
    )
    assert answer.status_code == 200, answer.content
    specs = [p["spec"] for p in answer.json()["approvals"]]
    assert specs == ["payments:charge amount>200 approver", "payments:refund 2*approver"]
    assert ada.get(PATH).json()["approvals"][1]["steps"][0]["count"] == 2
    event = AuditEvent.objects.filter(action="agent.approval_policies").latest("seq")
    assert event.actor == "ada" and event.outcome == AuditEvent.ALLOWED
    assert event.context["before"] == [] and event.context["after"] == specs
    answer = _put(ada, {"approvals": ["payments:charge 2*approver then security_responder"]})
    event = AuditEvent.objects.filter(action="agent.approval_policies").latest("seq")
    assert event.context["before"] == specs
    assert event.context["after"] == ["payments:charge 2*approver then security_responder"]


def test_a_bad_policy_is_a_422_naming_its_index_and_nothing_changes(agent, as_user):
    ada = as_user("ada")
    _put(ada, {"approvals": ["payments:charge approver"]})
    for bad in (
        ["payments:charge approver", "payments:charge 0*approver"],
        ["payments:charge approver", "nonsense"],
        ["payments:charge approver", {"approval": "payments:refund", "steps": [{"role": "x"}]}],
    ):
        answer = _put(ada, {"approvals": bad})
        assert answer.status_code == 422, (bad, answer.content)
        assert answer.json()["field"] == "approvals[1]", answer.json()
    assert [p.spec for p in ApprovalPolicy.objects.all()] == ["payments:charge approver"]
    denied = AuditEvent.objects.filter(action="agent.approval_policies", outcome="denied")
    assert denied.count() == 3


@pytest.mark.parametrize("who", ["vera", "otto", "april", "ian", "sam"])
def test_only_an_admin_may(agent, as_user, who):
    api = as_user(who)
    assert api.get(PATH).status_code == 403
    assert _put(api, {"approvals": ["payments:charge approver"]}).status_code == 403
    assert not ApprovalPolicy.objects.exists()
    denied = AuditEvent.objects.get(action="agent.approval_policies")
    assert denied.outcome == AuditEvent.DENIED and denied.actor == who


def test_a_worker_token_may_not_and_an_unknown_agent_is_404(agent, worker, as_user):
    assert worker.get(PATH).status_code == 403
    assert _put(worker, {"approvals": []}).status_code == 403
    ada = as_user("ada")
    assert ada.get("/agents/nope/approval-policies").status_code == 404
    assert _put(ada, {"approvals": []}).status_code == 200
    missing = ada.client.put(
        "/api/v1/agents/nope/approval-policies",
        data=json.dumps({"approvals": []}),
        content_type="application/json",
        **ada.headers,
    )
    assert missing.status_code == 404
