"""Seed the demo: role users (logins printed), agents with their scopes, the teams payments and
support with their people, and a worker token for the demo agents (written to
var/demo-worker-token, mode 600). Idempotent.

Four eyes: rita, the demo's requester, starts some of the purchases that need an approval in person
(the traffic uses her token, var/demo-requester-token). She holds the approver role too, so she sees
her own purchase's approval in the inbox, and the console refuses her deciding it: the identity that
started the run never decides its approvals (interventions/approvals.py). april decides it."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand

from core.actors import system_actor
from core.roles import ROLES
from runs.models import ApiToken, Team, TeamMembership
from runs.services import teams
from runs.services.access import create_user, ensure_roles, issue_token, set_user_roles
from runs.services.agents import register_agent

DEMO_AGENTS = {
    "purchasing": (
        [
            "inventory:*",
            "shipping:*",
            "payments:charge",
            "payments:refund",
            "notifications:*",
            "address:verify",
        ],
        "reads price and stock, reserves, delegates address checks, buys a label, charges, notifies",
    ),
    "address-verifier": (["address:verify"], "child runs: verifies a shipping address"),
    "refunds": (["payments:refund", "notifications:*"], "refunds a charge and tells the customer"),
    "lg-purchasing": (
        ["inventory:*", "payments:charge", "payments:refund", "notifications:*"],
        "the purchase as a LangGraph graph (governed by the LangGraph adapter)",
    ),
    "oa-purchasing": (
        ["inventory:*", "payments:charge", "payments:refund", "notifications:*"],
        "the purchase as an OpenAI Agents SDK agent (governed by its adapter)",
    ),
}
# The purchasing agent's big charges need a human, by its registration, whatever the worker asks.
DEMO_APPROVALS = {"purchasing": ["payments:charge amount>200 approver"]}
DEMO_USERS = {
    "admin": "admin",
    "vera": "viewer",
    "otto": "operator",
    "olga": "operator",
    "april": "approver",
    "ian": "incident_commander",
    "sam": "security_responder",
}
# People who start runs themselves (docs/operations/demo.md, "Four eyes and versions").
DEMO_REQUESTERS = {"rita": ["operator", "approver"]}
# Teams (docs/operator/teams.md, docs/operations/demo.md "Teams"): the demo's agents, its worker
# token and the people above stay in the default team, so the demo runs as before; pat and sue each
# see one team only (empty until an agent is moved there), mo is in all three and gets the switcher.
DEMO_TEAMS = ["payments", "support"]
DEMO_TEAM_PEOPLE = {"pat": ["payments"], "sue": ["support"], "mo": ["default", *DEMO_TEAMS]}
REQUESTER_TOKEN_FILE = "demo-requester-token"


class Command(BaseCommand):
    help = "Seed demo users (one per role), agents and the demo worker token."

    def handle(self, *args, **opts):
        seeder = system_actor("seed_demo", name="manage.py")
        ensure_roles(actor=seeder)
        password = os.environ.get("DEMO_PASSWORD", "controlplane-demo")
        for username, role in DEMO_USERS.items():
            user = User.objects.filter(username=username).first()
            if user is None:
                create_user(
                    actor=seeder,
                    username=username,
                    password=password,
                    roles=[role],
                    staff=role == "admin",
                )
            elif not user.groups.filter(name=role).exists():
                roles = {*user.groups.filter(name__in=ROLES).values_list("name", flat=True), role}
                set_user_roles(actor=seeder, user=user, roles=roles)
        for username, roles in DEMO_REQUESTERS.items():
            user = User.objects.filter(username=username).first()
            if user is None:
                create_user(actor=seeder, username=username, password=password, roles=roles)
            elif set(roles) - set(user.groups.values_list("name", flat=True)):
                have = user.groups.filter(name__in=ROLES).values_list("name", flat=True)
                set_user_roles(actor=seeder, user=user, roles={*have, *roles})
        _seed_teams(seeder, password)
        for name, (scopes, description) in DEMO_AGENTS.items():
            register_agent(
                actor=seeder,
                name=name,
                scopes=scopes,
                description=description,
                approvals=DEMO_APPROVALS.get(name, []),
            )
        token_file = Path(settings.VAR_DIR) / "demo-worker-token"
        _kept_token(
            token_file,
            lambda: issue_token(
                actor=seeder, kind=ApiToken.WORKER, name="demo-agents", agents=list(DEMO_AGENTS)
            ),
        )
        for username in DEMO_REQUESTERS:
            _kept_token(
                Path(settings.VAR_DIR) / REQUESTER_TOKEN_FILE,
                lambda username=username: issue_token(
                    actor=seeder,
                    kind=ApiToken.OPERATOR,
                    name=f"{username}-demo-requests",
                    user=User.objects.get(username=username),
                ),
            )
        self.stdout.write(f"demo logins (password: {password}):")
        for username, role in DEMO_USERS.items():
            self.stdout.write(f"  {username:6} {role}")
        for username, roles in DEMO_REQUESTERS.items():
            self.stdout.write(
                f"  {username:6} {', '.join(roles)}: starts purchases herself; may not approve them"
            )
        for username, team_slugs in DEMO_TEAM_PEOPLE.items():
            self.stdout.write(f"  {username:6} operator in team(s) {', '.join(team_slugs)}")
        self.stdout.write(f"demo worker token in {token_file}")


def _seed_teams(seeder, password: str) -> None:
    """The demo's teams and their people, through the audited services; idempotent."""
    for slug in DEMO_TEAMS:
        if not Team.objects.filter(slug=slug).exists():
            teams.create_team(actor=seeder, slug=slug, name=slug.capitalize())
    for username, team_slugs in DEMO_TEAM_PEOPLE.items():
        user = User.objects.filter(username=username).first()
        if user is None:
            user = create_user(
                actor=seeder, username=username, password=password, roles=["operator"]
            )
        for slug in team_slugs:
            if not TeamMembership.objects.filter(user=user, team__slug=slug).exists():
                teams.add_member(actor=seeder, team=slug, username=username)


def _kept_token(path: Path, issue) -> None:
    """The token in ``path`` if it still works, else a new one written there (mode 600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = path.read_text().strip() if path.exists() else ""
    if (
        secret
        and ApiToken.objects.filter(
            token_hash=ApiToken.hash_secret(secret), revoked_at__isnull=True
        ).exists()
    ):
        return
    _, secret = issue()
    path.write_text(secret + "\n")
    path.chmod(0o600)
