"""Seed the demo: role users (logins printed), agents with their scopes, and a worker token for the
demo agents (written to var/demo-worker-token, mode 600). Idempotent."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand

from core.actors import system_actor
from core.roles import ROLES
from runs.models import ApiToken
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


class Command(BaseCommand):
    help = "Seed demo users (one per role), agents and the demo worker token."

    def handle(self, *args, **opts):
        for name in ROLES:
            Group.objects.get_or_create(name=name)
        password = os.environ.get("DEMO_PASSWORD", "controlplane-demo")
        for username, role in DEMO_USERS.items():
            user, created = User.objects.get_or_create(
                username=username, defaults={"is_staff": role == "admin"}
            )
            if created:
                user.set_password(password)
                user.is_superuser = user.is_staff = role == "admin"
                user.save()
            user.groups.add(Group.objects.get(name=role))
        seeder = system_actor("seed_demo", name="manage.py")
        for name, (scopes, description) in DEMO_AGENTS.items():
            register_agent(
                actor=seeder,
                name=name,
                scopes=scopes,
                description=description,
                approvals=DEMO_APPROVALS.get(name, []),
            )
        token_file = Path(settings.VAR_DIR) / "demo-worker-token"
        token_file.parent.mkdir(parents=True, exist_ok=True)
        secret = token_file.read_text().strip() if token_file.exists() else ""
        if (
            not secret
            or not ApiToken.objects.filter(
                token_hash=ApiToken.hash_secret(secret), revoked_at__isnull=True
            ).exists()
        ):
            _, secret = ApiToken.issue(
                kind=ApiToken.WORKER, name="demo-agents", agents=list(DEMO_AGENTS)
            )
            token_file.write_text(secret + "\n")
            token_file.chmod(0o600)
        self.stdout.write(f"demo logins (password: {password}):")
        for username, role in DEMO_USERS.items():
            self.stdout.write(f"  {username:6} {role}")
        self.stdout.write(f"demo worker token in {token_file}")
