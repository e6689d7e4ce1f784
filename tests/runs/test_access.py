"""Agents, tokens, users and roles change only through runs/services/access.py: the management
commands and the Django admin call it, so every change (and every refused one) leaves an audit event
in the same transaction; a revoked token stays revoked."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from audit.services import verify_chain
from runs.management.commands.seed_demo import (
    DEMO_AGENTS,
    DEMO_REQUESTERS,
    DEMO_TEAM_PEOPLE,
    DEMO_USERS,
)
from runs.models import Agent, ApiToken

pytestmark = pytest.mark.django_db


def _events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("seq"))


def _call(*args) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_register_agent_is_audited_and_an_update_records_what_was_before():
    _call("register_agent", "billing", "--scope", "payments:charge", "--description", "bills")
    [created] = _events("agent.register")
    assert (created.actor, created.component) == ("manage.py", "register_agent")
    assert created.context["after"]["scopes"] == ["payments:charge"]
    assert created.context["before"] is None
    _call("register_agent", "billing", "--scope", "payments:*")
    updated = _events("agent.register")[-1]
    assert updated.context["before"] == {"scopes": ["payments:charge"], "description": "bills"}
    assert Agent.objects.get(name="billing").allowed_scopes == ["payments:*"]
    assert verify_chain().ok


def test_a_refused_command_is_audited_as_denied_and_changes_nothing():
    with pytest.raises(CommandError, match="tool:action"):
        _call("register_agent", "billing", "--scope", "payments")
    [denied] = _events("agent.register")
    assert denied.outcome == AuditEvent.DENIED and "invalid" in denied.reason
    assert not Agent.objects.filter(name="billing").exists()
    with pytest.raises(CommandError, match="unknown agent"):
        _call("create_worker_token", "w", "--agent", "nobody")
    assert _events("token.issue")[0].outcome == AuditEvent.DENIED
    assert not ApiToken.objects.exists()


def test_worker_and_operator_tokens_are_audited_without_their_secret():
    Agent.objects.create(name="purchasing", allowed_scopes=[])
    User.objects.create_user("otto")
    secret_w = _call("create_worker_token", "w-1", "--agent", "purchasing").splitlines()[-1]
    secret_o = _call("create_api_token", "otto").splitlines()[-1]
    worker, operator = _events("token.issued")
    assert worker.object_id == secret_w[:8] and worker.context["agents"] == ["purchasing"]
    assert operator.object_id == secret_o[:8] and operator.context["user"] == "otto"
    assert not AuditEvent.objects.filter(context__icontains=secret_w[8:]).exists()


def test_seeding_every_role_at_once_is_one_audit_event_naming_them_all():
    from core.roles import ROLES

    Group.objects.filter(name__in=ROLES).delete()
    _call("seed_roles")
    [created] = _events("roles.created")
    assert created.object_id == "all" and sorted(created.context["roles"]) == sorted(ROLES)
    assert Group.objects.filter(name__in=ROLES).count() == len(ROLES)


def test_revoke_token_is_audited_and_final():
    _, secret = ApiToken.issue(kind=ApiToken.WORKER, name="w-1")
    _call("revoke_token", secret[:8])
    [revoked] = _events("token.revoked")
    assert revoked.object_id == secret[:8]
    assert ApiToken.objects.get(prefix=secret[:8]).revoked_at is not None
    with pytest.raises(CommandError, match="no live token"):
        _call("revoke_token", secret[:8])
    assert _events("token.revoke")[0].outcome == AuditEvent.DENIED


def test_seed_roles_and_set_roles_are_audited():
    Group.objects.filter(name="viewer").delete()
    _call("seed_roles")
    [created] = _events("roles.created")
    assert created.context["roles"] == ["viewer"]
    _call("seed_roles")  # nothing missing: no change, no event
    assert len(_events("roles.created")) == 1
    user = User.objects.create_user("vera")
    _call("set_roles", "vera", "viewer", "approver")
    [changed] = _events("user.roles_set")
    assert changed.context == {"before": [], "after": ["approver", "viewer"]}
    assert set(user.groups.values_list("name", flat=True)) == {"approver", "viewer"}
    with pytest.raises(CommandError, match="unknown role"):
        _call("set_roles", "vera", "overlord")


def test_seed_demo_writes_through_the_services_and_a_second_run_changes_nothing(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    people = len(DEMO_USERS) + len(DEMO_REQUESTERS) + len(DEMO_TEAM_PEOPLE)
    _call("seed_demo")
    assert len(_events("user.created")) == people
    assert len(_events("agent.register")) == len(DEMO_AGENTS)
    assert len(_events("token.issued")) == 2  # the demo agents' and the requester's
    assert _events("user.created")[0].component == "seed_demo"
    assert User.objects.get(username="admin").is_superuser
    assert set(User.objects.get(username="ian").groups.values_list("name", flat=True)) == {
        "incident_commander"
    }
    _call("seed_demo")  # users, roles and the token exist: none is written again
    assert len(_events("user.created")) == people and len(_events("token.issued")) == 2
    assert not _events("user.roles_set")[people:]
    assert verify_chain().ok


# --- the Django admin ------------------------------------------------------------------------------


@pytest.fixture
def admin_client(client):
    admin = User.objects.create_superuser("root", password="pw-root")
    client.force_login(admin)
    return client


def test_a_revoked_token_cannot_be_unrevoked_through_the_admin(admin_client):
    token, secret = ApiToken.issue(kind=ApiToken.WORKER, name="w-1")
    ApiToken.objects.filter(pk=token.pk).update(revoked_at="2026-01-01T00:00:00Z")
    url = f"/admin/runs/apitoken/{token.pk}/change/"
    assert admin_client.get(url).status_code == 200  # shown, read-only
    resp = admin_client.post(url, {"name": "w-1", "kind": "worker", "revoked_at": ""})
    assert resp.status_code == 403
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    delete = admin_client.post(f"/admin/runs/apitoken/{token.pk}/delete/", {"post": "yes"})
    assert delete.status_code == 302  # deleting is final too, and audited
    [deleted] = _events("token.deleted")
    assert deleted.object_id == secret[:8] and not ApiToken.objects.filter(pk=token.pk).exists()


def test_revoking_through_the_admin_is_audited(admin_client):
    token, _ = ApiToken.issue(kind=ApiToken.WORKER, name="w-1")
    resp = admin_client.post(
        "/admin/runs/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}
    )
    assert resp.status_code == 302
    [revoked] = _events("token.revoked")
    assert (revoked.actor, revoked.component) == ("root", "admin")
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_agents_are_read_only_in_the_admin(admin_client):
    resp = admin_client.post(
        "/admin/runs/agent/add/",
        {"name": "billing", "description": "", "allowed_scopes": '["payments:charge"]'},
    )
    assert resp.status_code == 403
    assert not Agent.objects.filter(name="billing").exists()
