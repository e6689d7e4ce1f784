"""Audited account events: logins, logouts, failed logins, lockouts, and changes to users and roles
(Django groups) made through the admin.

The edges (auth signal receivers in audit/access/receivers.py, the admin classes in audit/access/admin.py)
only call these. A change's audit row is written inside the transaction of the change (the admin's
change and delete views are atomic), so a change whose audit write fails does not happen.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest

from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import Actor
from core.auth import actor_for_user, request_meta
from core.live import push_session_check

LOGIN, LOGOUT, LOGIN_FAILED, LOGIN_LOCKED_OUT = (
    "login",
    "logout",
    "login_failed",
    "login_locked_out",
)
USER_CREATE, USER_CHANGE, USER_DELETE = "user_create", "user_change", "user_delete"
USER_PASSWORD = "user_password_change"
ROLE_CREATE, ROLE_CHANGE, ROLE_DELETE = "role_create", "role_change", "role_delete"
# The fields of a user that decide what they may do; a change to any of them wakes their sockets.
ACCESS_FIELDS = ("is_active", "is_staff", "is_superuser", "groups")


def _component(request: HttpRequest | None) -> str:
    path = getattr(request, "path", "") or ""
    return "admin" if path.startswith("/admin/") else "console"


def _anonymous(username: str, request: HttpRequest | None) -> Actor:
    meta = request_meta(request) if request is not None else {}
    return Actor(
        kind="anonymous", name=(username or "")[:150], component=_component(request), **meta
    )


def record_login(*, user, request: HttpRequest | None) -> AuditEvent:
    actor = actor_for_user(user, request, component=_component(request))
    # Which way they came in: a password here or the identity provider (audit/access/sso.py).
    method = "oidc" if getattr(user, "backend", "").endswith("OIDCBackend") else "password"
    return record_audit(
        actor=actor, action=LOGIN, object_type="user", object_id=user.pk, context={"method": method}
    )


def record_logout(*, user, request: HttpRequest | None) -> AuditEvent | None:
    """The sockets of the ended session are woken by the logout view once the session is flushed
    (this runs before); any other logout (the admin's) is caught by the sockets' own periodic check."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None  # logging out an anonymous session changes nothing
    actor = actor_for_user(user, request, component=_component(request))
    return record_audit(actor=actor, action=LOGOUT, object_type="user", object_id=user.pk)


def record_login_failed(*, username: str, request: HttpRequest | None) -> AuditEvent | None:
    """A wrong password, or an unknown or inactive user. An attempt django-axes refused (or whose
    failure crossed the limit) is recorded once, as the lockout, by ``record_lockout``."""
    if getattr(request, "axes_locked_out", False):
        return None
    return record_audit(
        actor=_anonymous(username, request),
        action=LOGIN_FAILED,
        object_type="user",
        object_id=(username or "")[:64],
        outcome=AuditEvent.DENIED,
        reason="invalid credentials",
    )


def record_lockout(
    *, username: str, request: HttpRequest | None, ip_address: str = ""
) -> AuditEvent:
    """django-axes locked this username+IP out (this failure crossed the limit) or refused an attempt
    while it stays locked out; either way the attempt never reached a password check that counts."""
    from django.conf import settings

    limit = settings.AXES_FAILURE_LIMIT
    return record_audit(
        actor=_anonymous(username, request),
        action=LOGIN_LOCKED_OUT,
        object_type="user",
        object_id=(username or "")[:64],
        outcome=AuditEvent.DENIED,
        reason=f"locked out: {limit} failed logins for this username from {ip_address}",
        context={"ip_address": ip_address, "failure_limit": limit},
    )


# --- users and roles, changed through the admin -----------------------------------------------------


def user_snapshot(user) -> dict[str, Any]:
    """What the user may do, read from the database (the m2m groups are saved after the row)."""
    return {
        "username": user.get_username(),
        "is_active": user.is_active,
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "groups": sorted(user.groups.values_list("name", flat=True)) if user.pk else [],
    }


def record_user_change(
    *, actor: Actor, user_id: int, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> AuditEvent:
    """One event per saved (or deleted) user with the access fields before and after; call inside the
    change's transaction. Sockets of a user whose access changed re-check at once after commit."""
    action = USER_CREATE if before is None else USER_DELETE if after is None else USER_CHANGE
    changed = sorted(
        key for key in ACCESS_FIELDS if (before or {}).get(key) != (after or {}).get(key)
    )
    event = record_audit(
        actor=actor,
        action=action,
        object_type="user",
        object_id=user_id,
        context={"before": before, "after": after, "changed": changed},
    )
    if before is not None and changed:
        transaction.on_commit(lambda: push_session_check(user_id))
    return event


def record_password_change(*, actor: Actor, user_id: int) -> AuditEvent:
    """The password itself is never recorded; its change logs the user's other sessions out."""
    event = record_audit(actor=actor, action=USER_PASSWORD, object_type="user", object_id=user_id)
    transaction.on_commit(lambda: push_session_check(user_id))
    return event


def role_snapshot(group) -> dict[str, Any]:
    return {
        "name": group.name,
        "permissions": sorted(group.permissions.values_list("codename", flat=True))
        if group.pk
        else [],
        "members": sorted(group.user_set.values_list("username", flat=True)) if group.pk else [],
    }


def record_role_change(
    *, actor: Actor, group_id: int, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> AuditEvent:
    action = ROLE_CREATE if before is None else ROLE_DELETE if after is None else ROLE_CHANGE
    event = record_audit(
        actor=actor,
        action=action,
        object_type="role",
        object_id=group_id,
        context={"before": before, "after": after},
    )
    # A renamed or deleted group changes what its members may do (roles are group names).
    members = set((before or {}).get("members", [])) | set((after or {}).get("members", []))
    if members and before != after:
        from django.contrib.auth import get_user_model

        ids = list(
            get_user_model().objects.filter(username__in=members).values_list("pk", flat=True)
        )

        def push_all() -> None:
            for pk in ids:
                push_session_check(pk)

        transaction.on_commit(push_all)
    return event


LOCKOUT_RESET = "login_lockout_reset"


def reset_lockouts(*, actor: Actor, username: str | None = None, ip: str | None = None) -> int:
    """Lift django-axes lockouts (all, or those of a username and/or an address) and record who did
    it, in one transaction: an unlocked account is an access change like any other."""
    from axes.utils import reset

    with transaction.atomic():
        removed = reset(ip=ip, username=username)
        scope = (
            " from ".join(part for part in (username, ip) if part) or "every username and address"
        )
        record_audit(
            actor=actor,
            action=LOCKOUT_RESET,
            object_type="user",
            object_id=(username or ip or "*")[:64],
            reason=f"lockouts lifted for {scope}: {removed} attempt records removed",
            context={"username": username, "ip_address": ip, "records_removed": removed},
        )
    return removed
