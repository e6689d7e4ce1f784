"""Single sign-on: an OpenID Connect login's claims become a user and their roles, audited.

The identity provider (IdP) is the source of a signed-in person's roles: at every login the groups of
its group claim are mapped to roles through settings.OIDC_GROUP_ROLES, and the user's roles become
exactly those (a role the IdP no longer grants is removed). Groups the mapping does not know are
ignored and named in the audit row. A login whose groups grant no role is refused and audited: a
person with no role has nothing to see.

A person signed in by the IdP never has a usable password; a local account of the same username (a
break-glass admin) is never taken over by an IdP login of that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.http import HttpRequest

from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import Actor
from core.auth import request_meta
from core.live import push_session_check
from core.roles import ROLES

SSO_LOGIN_REFUSED = "sso_login_refused"
SSO_USER_CREATE = "sso_user_create"
SSO_ROLES_CHANGE = "sso_roles_change"


class LoginRefused(Exception):
    """Why this IdP login does not sign anyone in (shown to the person and audited)."""

    def __init__(self, reason: str, *, groups: list[str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.groups = groups or []


@dataclass(frozen=True)
class RoleGrant:
    roles: list[str]
    ignored_groups: list[str]


def group_roles() -> dict[str, list[str]]:
    """IdP group -> roles, from settings (checked at start-up: every role is one of core.roles)."""
    return dict(getattr(settings, "OIDC_GROUP_ROLES", {}) or {})


def roles_for_groups(groups: list[str]) -> RoleGrant:
    mapping = group_roles()
    roles = sorted({role for group in groups for role in mapping.get(group, [])} & set(ROLES))
    return RoleGrant(roles=roles, ignored_groups=sorted({g for g in groups if g not in mapping}))


def claimed_groups(claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.OIDC_GROUPS_CLAIM, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return sorted({str(group)[:200] for group in value})


def username_from(claims: dict[str, Any]) -> str:
    return str(claims.get(settings.OIDC_USERNAME_CLAIM) or "")[:150]


def _idp_actor(username: str, request: HttpRequest | None) -> Actor:
    """Who acts at an IdP login: the person the IdP vouches for, not yet signed in."""
    meta = request_meta(request) if request is not None else {}
    return Actor(kind="anonymous", name=username or "?", component="console", **meta)


def refuse(*, username: str, reason: str, request: HttpRequest | None, **context: Any) -> None:
    record_audit(
        actor=_idp_actor(username, request),
        action=SSO_LOGIN_REFUSED,
        object_type="user",
        object_id=(username or "?")[:64],
        outcome=AuditEvent.DENIED,
        reason=reason,
        context={"method": "oidc", **context},
    )


def sign_in_from_claims(*, claims: dict[str, Any], request: HttpRequest | None):
    """The user these verified claims name, created or updated, their roles set from the IdP's groups
    in one transaction with the audit rows; raises LoginRefused (after auditing it) otherwise."""
    username = username_from(claims)
    groups = claimed_groups(claims)
    grant = roles_for_groups(groups)
    try:
        with transaction.atomic():
            user = _apply(username, claims, groups, grant, request)
        if not grant.roles:
            # The roles the IdP took away are gone (committed above); with none left, no sign-in.
            raise LoginRefused("your identity provider's groups grant no role here", groups=groups)
        return user
    except LoginRefused as refused:
        refuse(
            username=username,
            reason=refused.reason,
            request=request,
            groups=groups,
            ignored_groups=grant.ignored_groups,
        )
        raise


def _apply(username: str, claims, groups: list[str], grant: RoleGrant, request):
    if not username:
        raise LoginRefused(f"the identity provider sent no {settings.OIDC_USERNAME_CLAIM!r} claim")
    User = get_user_model()
    user = User.objects.select_for_update().filter(username=username).first()
    if user is not None and user.has_usable_password():
        raise LoginRefused(
            f"{username!r} is a local account here: an identity-provider login cannot sign it in",
            groups=groups,
        )
    if user is not None and not user.is_active:
        raise LoginRefused(f"{username!r} is deactivated here", groups=groups)
    actor = _idp_actor(username, request)
    created = user is None
    if user is None:
        user = User(username=username, email=str(claims.get("email") or "")[:254])
        user.set_unusable_password()
        user.save()
        record_audit(
            actor=actor,
            action=SSO_USER_CREATE,
            object_type="user",
            object_id=user.pk,
            context={"method": "oidc", "subject": str(claims.get("sub", ""))[:200]},
        )
    before = sorted(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    if before != grant.roles:
        keep = list(user.groups.exclude(name__in=ROLES))
        user.groups.set(keep + [Group.objects.get_or_create(name=r)[0] for r in grant.roles])
        record_audit(
            actor=actor,
            action=SSO_ROLES_CHANGE,
            object_type="user",
            object_id=user.pk,
            context={
                "before": before,
                "after": grant.roles,
                "granted": sorted(set(grant.roles) - set(before)),
                "removed": sorted(set(before) - set(grant.roles)),
                "groups": groups,
                "ignored_groups": grant.ignored_groups,
            },
        )
        if not created:
            pk = user.pk
            transaction.on_commit(lambda: push_session_check(pk))
    return user
