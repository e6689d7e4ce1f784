"""Single sign-on: an OpenID Connect login's claims become a user and their roles, audited.

The identity provider (IdP) is the source of a signed-in person's roles: at every login the groups of
its group claim are mapped to roles through settings.OIDC_GROUP_ROLES, and the user's roles become
exactly those (a role the IdP no longer grants is removed). Groups the mapping does not know are
ignored and named in the audit row. A login whose groups grant no role is refused and audited: a
person with no role has nothing to see.

A person is bound by the IdP's issuer and subject (audit.models.SsoIdentity), not by username: an IdP
rename renames the account (audited), and a first login whose name is, or looks like (NFKC, casefold,
Unicode confusables), another account's is refused. A person signed in by the IdP never has a usable
password; a local account of the same username (a break-glass admin) is never taken over.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from confusable_homoglyphs import confusables
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.http import HttpRequest
from django.utils import timezone

from audit.models import AuditEvent, SsoIdentity
from audit.services import record_audit
from core import pg as core_pg
from core.actors import Actor
from core.auth import request_meta
from core.live import push_session_check
from core.roles import ROLES

SSO_LOGIN_REFUSED = "sso_login_refused"
SSO_USER_CREATE = "sso_user_create"
SSO_ROLES_CHANGE = "sso_roles_change"
SSO_USER_RENAME = "sso_user_rename"
SSO_IDENTITY_BIND = "sso_identity_bind"
SSO_IDP_LOGOUT = "sso_idp_logout"
FIRST_LOGIN_LOCK = (
    0x5550_1061  # pg advisory lock key: first identity-provider logins, one at a time
)


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


def record_idp_logout(
    *, user_id: int, username: str, request: HttpRequest, endpoint: str = ""
) -> None:
    """The person was sent to the IdP's end-session endpoint to end their session there too."""
    meta = request_meta(request)
    record_audit(
        actor=Actor(kind="user", name=username, user_id=user_id, component="console", **meta),
        action=SSO_IDP_LOGOUT,
        object_type="user",
        object_id=user_id,
        context={"method": "oidc", "endpoint": endpoint.split("?", 1)[0][:200]},
    )


def sign_in_from_claims(
    *, claims: dict[str, Any], request: HttpRequest | None, issuer: str = "", subject: str = ""
):
    """The user these verified claims name, created or updated, their roles set from the IdP's groups
    in one transaction with the audit rows; raises LoginRefused (after auditing it) otherwise.

    The person is found by ``issuer`` + ``subject`` (the ID token's ``iss`` and ``sub``), never by
    username: the username claim is only what they are called here."""
    username = username_from(claims)
    groups = claimed_groups(claims)
    grant = roles_for_groups(groups)
    subject = subject or str(claims.get("sub") or "")
    issuer = issuer or default_issuer()
    try:
        with transaction.atomic():
            user = _apply(username, claims, groups, grant, request, issuer, subject[:255])
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
            issuer=issuer,
            subject=subject[:255],
        )
        raise


def default_issuer() -> str:
    """The IdP's issuer when its ID token names none: its authorization endpoint's origin."""
    configured = getattr(settings, "OIDC_OP_ISSUER", "")
    if configured:
        return configured
    parts = urlsplit(getattr(settings, "OIDC_OP_AUTHORIZATION_ENDPOINT", ""))
    return f"{parts.scheme}://{parts.netloc}"


# --- look-alike usernames -------------------------------------------------------------------------

# ASCII look-alikes the confusables table does not fold (Unicode TR39 skeleton, ASCII part).
_ASCII_LOOKALIKES = (("rn", "m"), ("vv", "w"), ("0", "o"), ("1", "l"), ("|", "l"))


def name_key(name: str) -> str:
    """What a name looks like: NFKC, casefolded, every character that is confusable with a Latin or
    common one replaced by it, and a few ASCII look-alikes folded. Two names with one key look alike."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    out = []
    for ch in folded:
        if ord(ch) < 128 or unicodedata.category(ch).startswith("M"):
            out.append("" if unicodedata.category(ch).startswith("M") else ch)
            continue
        found = confusables.is_confusable(ch, greedy=True, preferred_aliases=["latin", "common"])
        latin = ""
        for entry in found or []:
            for glyph in entry.get("homoglyphs", []):
                candidate = unicodedata.normalize("NFKC", glyph["c"]).casefold()
                if candidate.isascii():
                    latin = candidate
                    break
            if latin:
                break
        out.append(latin or ch)
    key = "".join(out)
    for lookalike, letter in _ASCII_LOOKALIKES:
        key = key.replace(lookalike, letter)
    return key


def lookalike_of(name: str, *, exclude_pk: int | None = None) -> str | None:
    """An existing username that looks like ``name`` (another account), or None."""
    key = name_key(name)
    User = get_user_model()
    others = User.objects.exclude(pk=exclude_pk) if exclude_pk is not None else User.objects.all()
    for other in others.values_list("username", flat=True).iterator():
        if other == name or name_key(other) == key:
            return other
    return None


def _serialize_first_logins() -> None:
    """First logins (no identity yet) take one lock, so two of the same person at once make one
    account, and two look-alike names at once cannot both pass the look-alike check."""
    if core_pg.enabled(connection):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [FIRST_LOGIN_LOCK])


def _apply(username, claims, groups, grant: RoleGrant, request, issuer: str, subject: str):
    if not username:
        raise LoginRefused(f"the identity provider sent no {settings.OIDC_USERNAME_CLAIM!r} claim")
    if not subject:
        raise LoginRefused("the identity provider sent no subject ('sub')")
    actor = _idp_actor(username, request)
    identity = _identity(issuer, subject)
    if identity is None:
        _serialize_first_logins()
        identity = _identity(issuer, subject)
    created = identity is None
    if identity is None:
        user = _first_login(username, claims, groups, actor, issuer, subject)
    else:
        user = identity.user
        if not user.is_active:
            raise LoginRefused(f"{user.username!r} is deactivated here", groups=groups)
        if user.username != username:
            _rename(user, username, actor, issuer, subject)
        SsoIdentity.objects.filter(pk=identity.pk).update(last_login_at=timezone.now())
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


def _identity(issuer: str, subject: str) -> SsoIdentity | None:
    return (
        SsoIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=issuer, subject=subject)
        .first()
    )


def _first_login(username: str, claims, groups, actor: Actor, issuer: str, subject: str):
    User = get_user_model()
    same = User.objects.select_for_update().filter(username=username).first()
    if same is not None:
        if same.has_usable_password():
            raise LoginRefused(
                f"{username!r} is a local account here: an identity-provider login cannot sign it in",
                groups=groups,
            )
        if same.sso_identities.exists():
            raise LoginRefused(
                f"{username!r} already names another person of the identity provider here",
                groups=groups,
            )
        if not same.is_active:
            raise LoginRefused(f"{username!r} is deactivated here", groups=groups)
        # An IdP user made before identities were bound by subject: bound now, once.
        SsoIdentity.objects.create(
            issuer=issuer, subject=subject, user=same, last_login_at=timezone.now()
        )
        record_audit(
            actor=actor,
            action=SSO_IDENTITY_BIND,
            object_type="user",
            object_id=same.pk,
            context={"method": "oidc", "issuer": issuer, "subject": subject},
        )
        return same
    lookalike = lookalike_of(username)
    if lookalike is not None:
        raise LoginRefused(
            f"{username!r} looks like the existing user {lookalike!r}: ask an admin", groups=groups
        )
    user = User(username=username, email=str(claims.get("email") or "")[:254])
    user.set_unusable_password()
    user.save()
    SsoIdentity.objects.create(
        issuer=issuer, subject=subject, user=user, last_login_at=timezone.now()
    )
    record_audit(
        actor=actor,
        action=SSO_USER_CREATE,
        object_type="user",
        object_id=user.pk,
        context={"method": "oidc", "issuer": issuer, "subject": subject},
    )
    return user


def _rename(user, username: str, actor: Actor, issuer: str, subject: str) -> None:
    """The IdP renamed this person: the account follows, unless the new name is (or looks like)
    another account's, in which case the old name is kept. Either way, audited."""
    User = get_user_model()
    before = user.username
    context = {"before": before, "after": username, "issuer": issuer, "subject": subject}
    taken = User.objects.filter(username=username).exclude(pk=user.pk).exists()
    lookalike = username if taken else lookalike_of(username, exclude_pk=user.pk)
    if lookalike is not None:
        record_audit(
            actor=actor,
            action=SSO_USER_RENAME,
            object_type="user",
            object_id=user.pk,
            outcome=AuditEvent.DENIED,
            reason=f"{username!r} is or looks like the existing user {lookalike!r}: {before!r} kept",
            context=context,
        )
        return
    user.username = username
    user.save(update_fields=["username"])
    record_audit(
        actor=actor, action=SSO_USER_RENAME, object_type="user", object_id=user.pk, context=context
    )
