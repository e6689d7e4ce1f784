"""Logins, logouts, failed logins and lockouts (django-axes) are in the audit chain, and so is every
change to a user or a role made through the admin, with the access fields before and after."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from audit.models import AuditEvent
from audit.services import verify_chain

pytestmark = pytest.mark.django_db


def _events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("seq"))


def _login(client: Client, username: str, password: str, **extra):
    return client.post("/accounts/login/", {"username": username, "password": password}, **extra)


def test_it_audits_a_login_and_a_logout_with_where_they_came_from(cast):
    client = Client()
    response = _login(client, "otto", "pw-otto", HTTP_USER_AGENT="Firefox/140")
    assert response.status_code == 302
    (login,) = _events("login")
    assert (login.actor, login.role, login.outcome) == ("otto", "operator", "allowed")
    assert (login.object_type, login.object_id) == ("user", str(cast["otto"][0].pk))
    assert (login.source_ip, login.user_agent, login.component) == (
        "127.0.0.1",
        "Firefox/140",
        "console",
    )
    assert len(login.request_id) == 32  # generated: no trusted proxy vouched for one
    assert client.post("/accounts/logout/").status_code == 302
    (logout,) = _events("logout")
    assert (logout.actor, logout.object_id) == ("otto", str(cast["otto"][0].pk))
    assert verify_chain().ok


def test_it_audits_failed_logins_without_the_password(cast):
    response = _login(Client(), "otto", "guess-1")
    assert response.status_code == 200  # the form again, with its error
    _login(Client(), "nobody-such", "guess-2")
    failures = _events("login_failed")
    assert [(e.actor, e.actor_kind, e.outcome) for e in failures] == [
        ("otto", "anonymous", "denied"),
        ("nobody-such", "anonymous", "denied"),
    ]
    assert all(e.source_ip == "127.0.0.1" and e.reason == "invalid credentials" for e in failures)
    dump = str([e.hashed_fields() for e in AuditEvent.objects.all()])
    assert "guess-1" not in dump and "guess-2" not in dump
    assert not _events("login")


@override_settings(AXES_FAILURE_LIMIT=3)
def test_it_locks_a_username_and_ip_out_after_repeated_failures_and_audits_the_lockout(cast):
    client = Client()
    assert _login(client, "otto", "wrong").status_code == 200
    assert _login(client, "otto", "wrong").status_code == 200
    locked = _login(client, "otto", "wrong")  # the third failure crosses the limit
    assert locked.status_code == 429
    # The right password no longer helps from this address...
    assert _login(client, "otto", "pw-otto").status_code == 429
    assert "_auth_user_id" not in client.session
    # ...but another username from it, or the same username from elsewhere, is not locked out.
    assert _login(Client(), "olga", "pw-olga").status_code == 302
    assert _login(Client(REMOTE_ADDR="192.0.2.9"), "otto", "pw-otto").status_code == 302

    assert len(_events("login_failed")) == 2
    lockouts = _events("login_locked_out")
    assert len(lockouts) == 2  # the failure that crossed the limit, then the refused right password
    assert all(e.actor == "otto" and e.outcome == "denied" for e in lockouts)
    assert lockouts[0].source_ip == "127.0.0.1" and lockouts[0].context["failure_limit"] == 3
    assert [e.actor for e in _events("login")] == ["olga", "otto"]
    assert verify_chain().ok


@pytest.fixture
def admin_client(db):
    root = User.objects.create_superuser("root", password="pw-root")
    client = Client()
    client.force_login(root)
    return client


def _user_form(user: User, **changes) -> dict:
    data = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on" if user.is_active else "",
        "is_staff": "on" if user.is_staff else "",
        "is_superuser": "on" if user.is_superuser else "",
        "groups": list(user.groups.values_list("pk", flat=True)),
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v not in ("", None)}


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("axes_reset_username", ["otto"]),
        ("axes_reset_ip_username", ["127.0.0.1", "otto"]),
        ("axes_reset_ip", ["127.0.0.1"]),
        ("axes_reset", []),
    ],
)
@override_settings(AXES_FAILURE_LIMIT=3)
def test_lifting_a_lockout_from_the_command_line_is_audited(cast, command, args):
    """axes' reset commands are replaced by audited ones: the lockout is lifted and the audit chain
    says by which command, for whom, and how many attempts went."""
    from io import StringIO

    from django.core.management import call_command

    client = Client()
    for _ in range(3):
        _login(client, "otto", "wrong")
    assert _login(client, "otto", "pw-otto").status_code == 429

    out = StringIO()
    call_command(command, *args, stdout=out)

    assert "1 attempts removed." in out.getvalue()  # axes keeps one record per username+address
    assert _login(client, "otto", "pw-otto").status_code == 302
    (reset,) = _events("login_lockout_reset")
    assert reset.actor == "manage.py" and reset.component == command
    assert reset.context["records_removed"] == 1
    assert "1 attempt records removed" in reset.reason
    assert verify_chain().ok


def test_an_admin_changing_a_users_roles_leaves_an_audit_event(cast, admin_client):
    vera = cast["vera"][0]
    operator, viewer = Group.objects.get(name="operator"), Group.objects.get(name="viewer")
    response = admin_client.post(
        f"/admin/auth/user/{vera.pk}/change/",
        _user_form(vera, groups=[viewer.pk, operator.pk], is_staff="on"),
        HTTP_USER_AGENT="admin-browser",
    )
    assert response.status_code == 302, response.content[:3000]
    (event,) = _events("user_change")
    assert (event.actor, event.role, event.component) == ("root", "admin", "admin")
    assert (event.object_type, event.object_id) == ("user", str(vera.pk))
    assert event.context["before"]["groups"] == ["viewer"]
    assert event.context["after"]["groups"] == ["operator", "viewer"]
    assert (
        event.context["before"]["is_staff"] is False and event.context["after"]["is_staff"] is True
    )
    assert event.context["changed"] == ["groups", "is_staff"]
    assert verify_chain().ok


def test_an_admin_deleting_a_user_or_a_role_leaves_an_audit_event(cast, admin_client):
    sam = cast["sam"][0]
    response = admin_client.post(f"/admin/auth/user/{sam.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    (deleted,) = _events("user_delete")
    assert deleted.context["before"]["groups"] == ["security_responder"]
    assert deleted.context["after"] is None

    approver = Group.objects.get(name="approver")
    response = admin_client.post(
        f"/admin/auth/group/{approver.pk}/change/", {"name": "approvers-renamed"}
    )
    assert response.status_code == 302
    (renamed,) = _events("role_change")
    assert renamed.context["before"]["name"] == "approver"
    assert renamed.context["after"]["name"] == "approvers-renamed"
    assert renamed.context["before"]["members"] == ["april"]
    assert verify_chain().ok


def test_an_admin_password_reset_is_audited_without_the_password(cast, admin_client):
    otto = cast["otto"][0]
    response = admin_client.post(
        f"/admin/auth/user/{otto.pk}/password/",
        {
            "password1": "a-new-long-secret-9",
            "password2": "a-new-long-secret-9",
            "set_usable_password": "true",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    (event,) = _events("user_password_change")
    assert event.object_id == str(otto.pk) and event.actor == "root"
    assert "a-new-long-secret-9" not in str(event.hashed_fields())


def test_a_failed_audit_write_undoes_the_admin_change(cast, admin_client, monkeypatch):
    """The audit row is part of the change's transaction: no audit, no change."""
    from audit.access import events as accounts

    def broken(**kwargs):
        raise RuntimeError("audit store unavailable")

    monkeypatch.setattr(accounts, "record_audit", broken)
    vera = cast["vera"][0]
    admin_client.raise_request_exception = False
    response = admin_client.post(
        f"/admin/auth/user/{vera.pk}/change/", _user_form(vera, is_superuser="on")
    )
    assert response.status_code == 500
    vera.refresh_from_db()
    assert vera.is_superuser is False
