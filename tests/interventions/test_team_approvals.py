"""Multi-party approval steps that name a team (``2*team:payments``): only the team's members fill
the step, the requester and the run's starter never count, a person counts once, every refusal is
audited, and the progress, the inbox and the API say "1 of 2 from team payments"."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from core.actors import system_actor
from runs.conditions import ConditionError, parse_policy_spec, parse_steps_json
from runs.models import Agent, ApiToken, Approval, ApprovalDecision, HistoryEvent, Run
from runs.services import teams
from runs.services.access import issue_token
from runs.services.agents import set_approval_policies
from tests.conftest import Api, claim, start_run
from tests.interventions.helpers import intervene, running_run

pytestmark = pytest.mark.django_db

SYSTEM = system_actor("test", name="tests")


@pytest.fixture
def payments(db):
    teams.create_team(actor=SYSTEM, slug="payments")


@pytest.fixture
def worker(agent, payments, client) -> Api:
    """The purchasing agent belongs to team payments (its runs too), its worker token as well: the
    team's members see the runs whose approvals they decide (docs/operator/teams.md)."""
    teams.move_agent(actor=SYSTEM, agent="purchasing", team="payments")
    _, secret = issue_token(
        actor=SYSTEM, kind="worker", name="w-pay", agents=["purchasing"], team="payments"
    )
    return Api(client, secret)


def _person(name: str, role: str = "approver", team: str | None = "payments") -> Api:
    user = User.objects.create_user(name, password="pw-" + name)
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    if team:
        teams.add_member(actor=SYSTEM, team=team, username=name)
    _, secret = ApiToken.issue(kind=ApiToken.OPERATOR, name=f"{name}-token", user=user)
    return Api(Client(), secret)


def _policy(spec="payments:charge 2*team:payments"):
    set_approval_policies(actor=SYSTEM, agent="purchasing", approvals=[spec])


def _ask(worker: Api, run_id: str, amount: int = 20000) -> dict:
    body = {
        "fencing_token": 1,
        "tool": "payments",
        "action": "charge",
        "args": {"amount": amount, "currency": "EUR"},
        "reason": "big",
    }
    resp = worker.post(f"/runs/{run_id}/approvals", body)
    assert resp.status_code == 201, resp.content
    return resp.json()


def _put(api: Api, body: dict):
    return api.client.put(
        "/api/v1/agents/purchasing/approval-policies",
        data=json.dumps(body),
        content_type="application/json",
        **api.headers,
    )


def _decide(api: Api, run_id: str, approval: dict, kind: str = "approve"):
    return intervene(api, run_id, kind, "checked", options={"approval_id": approval["id"]})


def test_both_spellings_parse():
    spec = parse_policy_spec("payments:charge amount>200 2*team:payments then security_responder")
    assert spec.multi_party and spec.condition == "amount>200"
    assert spec.approver_role == "security_responder"  # the strongest role step's
    assert [(s.stage, s.role, s.team, s.count) for s in spec.steps] == [
        (0, "", "payments", 2),
        (1, "security_responder", "", 1),
    ]
    alone = parse_policy_spec("payments:charge team:payments")
    assert alone.multi_party and alone.approver_role == "approver"
    assert alone.steps[0].as_json()["team"] == "payments" and alone.steps[0].spec == "team:payments"
    told = parse_policy_spec("payments:charge 2*team:payments escalate after 15m to team:payments")
    assert told.steps[0].escalate_to == "team:payments"
    steps = parse_steps_json([{"team": "payments", "count": 2, "within_s": 1800}])
    assert [(s.team, s.role, s.count, s.within_s) for s in steps] == [("payments", "", 2, 1800)]
    assert steps[0].spec == "2*team:payments within 30m"
    with pytest.raises(ConditionError, match="a role or a team, not both") as both:
        parse_steps_json([{"team": "payments", "role": "approver"}])
    assert both.value.field == "steps[0].team"
    with pytest.raises(ConditionError, match="team's name"):
        parse_steps_json([{"team": "no spaces"}])


def test_the_policy_round_trips(agent, payments):
    spec = "payments:charge 2*team:payments within 1h and approver"
    _policy(spec)
    row = Agent.objects.get(name="purchasing").approval_policies.get()
    assert row.spec == spec and row.steps[0]["team"] == "payments" and row.steps[0]["role"] == ""


def test_an_unknown_team_or_role_and_team_is_refused_naming_the_field(agent, payments, cast):
    ada = Api(Client(), cast["ada"][1])
    resp = _put(ada, {"approvals": ["payments:charge 2*team:ghosts"]})
    assert resp.status_code == 422, resp.content
    body = resp.json()
    assert body["field"] == "approvals[0]" and "ghosts" in body["detail"]
    assert body["team"] == "ghosts"
    resp = _put(
        ada,
        {"approvals": ["payments:refund", {"approval": "payments:charge", "steps": [
            {"role": "approver"}, {"team": "ghosts", "count": 2, "stage": 1}]}]},
    )  # fmt: skip
    assert resp.status_code == 422, resp.content
    assert resp.json()["field"] == "approvals[1].steps[1].team", resp.json()
    both = {"approval": "payments:charge", "steps": [{"team": "payments", "role": "approver"}]}
    resp = _put(ada, {"approvals": [both]})
    assert resp.status_code == 422 and resp.json()["field"] == "approvals[0].steps[0].team"
    assert "not both" in resp.json()["detail"]
    refused = AuditEvent.objects.filter(action="agent.approval_policies", outcome="denied")
    assert refused.count() == 3
    assert not Agent.objects.get(name="purchasing").approval_policies.exists()
    with pytest.raises(CommandError, match="no team 'ghosts'"):
        call_command(
            "register_agent", "purchasing", "--scope", "payments:charge",
            "--approval", "payments:charge 2*team:ghosts",
        )  # fmt: skip
    ok = _put(
        ada, {"approvals": [{"approval": "payments:charge", "steps": [{"team": "payments"}]}]}
    )
    assert ok.status_code == 200, ok.content


def test_a_non_member_is_refused_and_the_refusal_is_audited(worker, cast, payments):
    _policy()
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"])
    # ian: an incident commander, in the default team: he sees every team's runs (cross_team),
    # but is not in payments
    outsider = Api(Client(), cast["ian"][1])
    resp = _decide(outsider, run["id"], asked)
    assert resp.status_code == 403, resp.content
    body = resp.json()
    assert body["error"] == "approval_team_required" and body["required_team"] == "payments"
    assert "payments" in body["detail"]
    denied = AuditEvent.objects.get(action="intervention.approve", outcome="denied")
    assert denied.reason.startswith("approval_team_required") and denied.actor == "ian"
    rejected = _decide(outsider, run["id"], asked, kind="reject")
    assert rejected.status_code == 403 and rejected.json()["error"] == "approval_team_required"
    assert AuditEvent.objects.filter(action="intervention.reject", outcome="denied").count() == 1
    # april: an approver of the default team: the payments run does not exist for her (404)
    hidden = _decide(Api(Client(), cast["april"][1]), run["id"], asked)
    assert hidden.status_code == 404
    assert AuditEvent.objects.filter(action="intervention.approve", outcome="denied").count() == 2
    assert not ApprovalDecision.objects.exists()
    assert Approval.objects.get(pk=asked["id"]).status == "pending"


def test_two_members_complete_the_step_and_the_progress_says_so(worker, cast, payments):
    _policy()
    run, _ = running_run(worker)
    rid = run["id"]
    pam, pat = _person("pam"), _person("pat")
    _person("pia", role="operator")  # a member who may not approve at all: never named
    asked = _ask(worker, rid)
    step = asked["progress"]["steps"][0]
    assert step["team"] == "payments" and step["summary"] == "0 of 2 from team payments"
    assert step["may_decide"] == ["pam", "pat"]
    resp = _decide(pam, rid, asked)
    assert resp.status_code == 202, resp.content
    assert "still needs 1 from team payments" in resp.json()["receipt"]["delivery"]
    again = _decide(pam, rid, asked)
    assert again.status_code == 409 and "counts once" in again.json()["detail"]
    progress = worker.get(f"/runs/{rid}").json()["approvals"][0]["progress"]
    step = progress["steps"][0]
    assert step["summary"] == "1 of 2 from team payments"
    assert step["approved_by"] == ["pam"] and step["may_decide"] == ["pat"]
    decided = HistoryEvent.objects.get(run_id=rid, kind="approval_decided")
    assert decided.data["step_team"] == "payments" and decided.data["role"] == "approver"
    assert _decide(pat, rid, asked).status_code == 202
    row = Approval.objects.get(pk=asked["id"])
    assert row.status == "approved" and Run.objects.get(pk=rid).state == "running"
    assert AuditEvent.objects.filter(action="intervention.approve", outcome="allowed").count() == 2
    done = worker.get(f"/runs/{rid}").json()["approvals"][0]["progress"]["steps"][0]
    assert done["summary"] == "2 of 2 from team payments" and done["may_decide"] == []


def test_the_requester_who_is_a_member_never_counts(worker, cast, payments):
    _policy()
    starter = _person("pete", role="incident_commander")  # a member, and may start runs
    run = start_run(starter)
    claim(worker, run["id"])
    asked = _ask(worker, run["id"])
    assert asked["progress"]["steps"][0]["may_decide"] == []  # pete started it
    own = _decide(starter, run["id"], asked)
    assert own.status_code == 403 and own.json()["error"] == "separation_of_duties"
    assert AuditEvent.objects.filter(action="intervention.approve", outcome="denied").count() == 1
    assert not ApprovalDecision.objects.exists()
    # any rejection by a member ends it
    resp = _decide(_person("pam"), run["id"], asked, kind="reject")
    assert resp.status_code == 202, resp.content
    assert Approval.objects.get(pk=asked["id"]).status == "rejected"


def test_a_role_step_then_a_team_step(worker, cast, payments):
    _policy("payments:charge approver then team:payments")
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"])
    member = _person("pam")
    # the team step is not open yet: pam fits the approver step (her role) and fills it
    assert _decide(member, run["id"], asked).status_code == 202
    ian = Api(Client(), cast["ian"][1])
    resp = _decide(ian, run["id"], asked)  # he satisfies approver steps, but is not in payments
    assert resp.status_code == 403 and resp.json()["error"] == "approval_team_required"
    assert _decide(_person("pat"), run["id"], asked).status_code == 202
    assert Approval.objects.get(pk=asked["id"]).status == "approved"


@pytest.mark.django_db(transaction=True)
def test_two_members_racing_for_the_last_slot(postgres_only, worker, cast, payments):
    _policy()
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"])
    assert _decide(_person("first"), run["id"], asked).status_code == 202
    apis = {"b": _person("b"), "c": _person("c")}
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
        t.join(timeout=60)
    assert sorted(r.status_code for r in results.values()) == [202, 409], {
        k: r.content for k, r in results.items()
    }
    row = Approval.objects.get(pk=asked["id"])
    assert row.status == "approved"
    assert ApprovalDecision.objects.filter(approval=row, decision="approved").count() == 2
    assert HistoryEvent.objects.filter(run_id=run["id"], kind="approval_decided").count() == 2


def test_the_inbox_shows_it_to_members_only(worker, cast, payments, client):
    _policy()
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"])
    _person("pam")
    _person("pat")
    assert _decide(_person("pax"), run["id"], asked).status_code == 202
    client.force_login(User.objects.get(username="pam"))
    mine = client.get("/approvals/").content.decode()
    assert f'id="approval-{asked["id"]}"' in mine
    assert "1 of 2 from team payments" in mine and "approved by pax" in mine
    assert "may still decide: pam, pat" in mine
    client.force_login(User.objects.get(username="ian"))  # sees the run, is not a member
    theirs = client.get("/approvals/").content.decode()
    assert f'id="approval-{asked["id"]}"' not in theirs
    assert f'id="waiting-{asked["id"]}"' in theirs
    assert "needs 1 from team payments — currently: pam, pat" in theirs
    page = client.get(f"/runs/{run['id']}/").content.decode()
    assert "1 of 2 from team payments" in page and "may still decide: pam, pat" in page
    client.force_login(User.objects.get(username="april"))  # the payments run is not hers to see
    assert asked["id"] not in client.get("/approvals/").content.decode()
    client.force_login(User.objects.get(username="pam"))
    dialog = client.get(
        f"/runs/{run['id']}/interventions/new/",
        {"kind": "approve", "approval_id": asked["id"]},
        HTTP_HX_REQUEST="true",
    ).content.decode()
    assert 'data-testid="preview-progress"' in dialog
    assert "1 of 2 from team payments" in dialog and "may still decide: pam, pat" in dialog
    assert ">1 from team payments<" in dialog  # the card's "needs" cell: what the open step needs


def test_a_channel_of_the_team_is_told(worker, cast, payments):
    from notifications.jobs import escalate_due, fan_out
    from notifications.messages import message_for
    from notifications.models import Channel, Delivery

    Channel.objects.create(
        name="pay-hook", kind="webhook", url="https://x.test/h", roles=["team:payments"]
    )
    Channel.objects.create(
        name="sec", kind="webhook", url="https://x.test/s", roles=["security_responder"]
    )
    _policy("payments:charge 2*team:payments escalate after 15m to security_responder")
    run, _ = running_run(worker)
    asked = _ask(worker, run["id"])
    fan_out(asked["id"])
    delivery = Delivery.objects.get(approval_id=asked["id"])
    assert delivery.channel.name == "pay-hook"
    assert "needs 2 from team payments" in message_for(delivery)["summary"]
    # the step's own escalation: sent again to the channels serving security_responder, audited
    assert escalate_due(actor=SYSTEM, now=timezone.now() + timedelta(minutes=20)) == [asked["id"]]
    escalated = Delivery.objects.get(approval_id=asked["id"], reason=Delivery.ESCALATED)
    assert escalated.channel.name == "sec"
    audit = AuditEvent.objects.get(action="approval.notification_escalated")
    assert audit.context["from_policy_step"] == "team:payments"
