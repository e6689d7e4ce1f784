"""Two teams and their cast (docs/operator/teams.md): ``payments`` (pia, operator; sam, security
responder; worker token w_pay; agent pay-agent) and ``support`` (sol, operator; sue, security
responder; worker token w_sup; agent sup-agent), plus ian, an incident commander in payments
(cross_team). Support's objects -- a claimed run with a lease, an effect, an approval, a pause, a
child run, a held fleet operation, a standing freeze and an intake hold of support's -- are what
payments' people and tokens must not learn of."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from core.actors import system_actor
from runs.models import ApiToken
from runs.services import teams
from runs.services.access import issue_token
from runs.services.agents import register_agent
from tests.conftest import PURCHASING_SCOPES, Api, claim, declare, start_run

SYSTEM = system_actor("test", name="tests")


@dataclass
class Teams:
    tokens: dict[str, str] = field(default_factory=dict)  # person or worker -> bearer secret
    support: dict[str, str] = field(default_factory=dict)  # support's object ids by param name
    payments: dict[str, str] = field(default_factory=dict)

    def api(self, who: str) -> Api:
        return Api(Client(), self.tokens[who])

    def browser(self, who: str) -> Client:
        client = Client()
        assert client.login(username=who, password=f"pw-{who}")
        return client


def person(username: str, role: str, team: str | None) -> tuple[User, str]:
    user = User.objects.create_user(username, password=f"pw-{username}")
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    if team:
        teams.add_member(actor=SYSTEM, team=team, username=username)
    _, secret = ApiToken.issue(kind=ApiToken.OPERATOR, name=f"{username}-token", user=user)
    return user, secret


def team_objects(api: Api, owner: Api, agent: str) -> dict[str, str]:
    """A claimed run of ``agent`` with an effect, an approval, a child and a pause on it."""
    run = start_run(api, agent=agent)
    lease = claim(api, run["id"])
    token = lease["lease"]["fencing_token"]
    effect = declare(api, run["id"], token)
    assert effect.status_code == 201, effect.content
    child = start_run(api, agent=agent, parent_run_id=run["id"])
    approval = api.post(
        f"/runs/{run['id']}/approvals",
        {"fencing_token": token, "tool": "payments", "action": "refund", "args": {"amount": 5}},
    )
    assert approval.status_code == 201, approval.content
    pause = owner.post(f"/runs/{run['id']}/interventions", {"kind": "pause", "reason": "look"})
    assert pause.status_code == 202, pause.content
    return {
        "run_id": run["id"],
        "child_id": child["id"],
        "lease_id": lease["lease"]["id"],
        "fencing_token": str(token),
        "effect_id": effect.json()["id"],
        "approval_id": approval.json()["id"],
        "intervention_id": pause.json()["id"],
    }


@pytest.fixture
def two_teams(db) -> Teams:
    for slug in ("payments", "support"):
        teams.create_team(actor=SYSTEM, slug=slug)
    cast = Teams()
    for name, team in (("pay-agent", "payments"), ("sup-agent", "support")):
        register_agent(actor=SYSTEM, name=name, scopes=PURCHASING_SCOPES, team=team)
    for name, role, team in (
        ("pia", "operator", "payments"),
        ("sol", "operator", "support"),
        ("ian", "incident_commander", "payments"),
        ("sam", "security_responder", "payments"),
        ("sue", "security_responder", "support"),
    ):
        cast.tokens[name] = person(name, role, team)[1]
    for name, team in (("w_pay", "payments"), ("w_sup", "support")):
        cast.tokens[name] = issue_token(actor=SYSTEM, kind="worker", name=name, team=team)[1]
    cast.support = team_objects(cast.api("w_sup"), cast.api("sol"), "sup-agent")
    cast.payments = team_objects(cast.api("w_pay"), cast.api("pia"), "pay-agent")
    held = cast.api("sol").post(
        "/fleet",
        {
            "kind": "cancel",
            "filter": f"id={cast.support['child_id']}",
            "reason": "walk",
            "hold": True,
        },
    )
    assert held.status_code == 202, held.content
    cast.support["operation_id"] = held.json()["id"]
    # Support's standing freeze (set by its own security responder: support's by default) and an
    # intake hold of support's, set by ian under cross_team (only cross_team roles hold intake).
    freeze = cast.api("sue").post(
        "/fleet/freezes",
        {"capability": "inventory:audit", "over": "everything", "reason": "walk"},
    )
    assert freeze.status_code == 201, freeze.content
    cast.support["freeze_id"] = freeze.json()["freeze"]["id"]
    hold = cast.api("ian").post(
        "/intake/holds",
        {"scope": "tool", "target": "crm", "team": "support", "reason": "walk"},
    )
    assert hold.status_code == 202, hold.content
    cast.support["hold_id"] = hold.json()["id"]
    return cast


def made_up() -> dict[str, str]:
    """Ids nobody ever used, one per path parameter."""
    ids = {k: str(uuid.uuid4()) for k in ("run_id", "lease_id", "effect_id", "intervention_id")}
    return ids | {
        "operation_id": str(uuid.uuid4()),
        "child_id": str(uuid.uuid4()),
        "freeze_id": str(uuid.uuid4()),
        "hold_id": str(uuid.uuid4()),
    }
