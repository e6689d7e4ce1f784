"""Who may call the control plane: tokens, users and their roles (agents: services/agents.py). The
management commands and the Django admin call these, so every change (and every refused one) leaves
an audit event, written in the change's transaction.

Plain ``transaction.atomic()`` (not durable): the admin runs each save in its own transaction, and
the change and its audit event join it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import Actor
from core.errors import DomainError, Invalid, NotFound
from core.roles import ROLES
from core.tokens import forget_revoked
from runs.models import Agent, ApiToken

from .teams import team_for_new_row


def _audit(actor: Actor, action: str, object_type: str, object_id: Any, **context: Any) -> None:
    record_audit(
        actor=actor, action=action, object_type=object_type, object_id=object_id, context=context
    )


@contextmanager
def _change(actor: Actor, action: str, object_type: str, object_id: Any) -> Iterator[None]:
    """The change and its audit event in one transaction; a refused change is audited as denied."""
    try:
        with transaction.atomic():
            yield
    except DomainError as err:
        record_audit(
            actor=actor,
            action=action,
            object_type=object_type,
            object_id=object_id,
            outcome=AuditEvent.DENIED,
            reason=f"{err.code}: {err.detail}",
            context=err.payload(),
        )
        raise


def _roles(user) -> list[str]:
    return sorted(user.groups.filter(name__in=ROLES).values_list("name", flat=True))


def issue_token(
    *,
    actor: Actor,
    kind: str,
    name: str,
    user=None,
    agents: Iterable[str] = (),
    team: str | None = None,
) -> tuple[ApiToken, str]:
    """A new bearer token and its secret (shown once, never stored). A worker token belongs to
    ``team`` (default: the default team) and acts on that team's runs only; the agents it names must
    be that team's."""
    agents = list(agents)
    with _change(actor, "token.issue", "token", name):
        if kind not in (ApiToken.WORKER, ApiToken.OPERATOR):
            raise Invalid("kind must be 'worker' or 'operator'", field="kind")
        if kind == ApiToken.OPERATOR and user is None:
            raise Invalid("an operator token acts as a user", field="user")
        owner = team_for_new_row(team)
        if owner is not None and kind != ApiToken.WORKER:
            raise Invalid("an operator token acts for its user's teams", field="team")
        mine = Agent.objects.filter(name__in=agents, team=owner)
        known = set(mine.values_list("name", flat=True))
        missing = sorted(set(agents) - known)
        if missing:
            raise NotFound(
                f"unknown agent(s) of team {team or 'default'}: {', '.join(missing)}"
                " (register_agent first, or --team the agents' team)",
                field="agent",
            )
        token, secret = ApiToken.issue(kind=kind, name=name, user=user, agents=agents)
        if owner is not None:
            ApiToken.objects.filter(pk=token.pk).update(team=owner)
            token.team = owner
        _audit(
            actor,
            "token.issued",
            "token",
            token.prefix,
            kind=kind,
            name=name,
            user=user.get_username() if user else None,
            agents=agents,
            team=team or "default",
        )
    return token, secret


def revoke_token(*, actor: Actor, prefix: str = "", token_id: int | None = None) -> int:
    """Revoke live tokens by visible prefix (or one by id). Final: no service un-revokes a token."""
    with _change(actor, "token.revoke", "token", prefix or token_id):
        live = ApiToken.objects.select_for_update().filter(revoked_at__isnull=True)
        if token_id is not None:
            tokens = list(live.filter(pk=token_id))
        else:
            tokens = list(live.filter(prefix=prefix)) if prefix else []
        if not tokens:
            raise NotFound(f"no live token {prefix or token_id!r}", object="token")
        now = timezone.now()
        for token in tokens:
            ApiToken.objects.filter(pk=token.pk).update(revoked_at=now)
            forget_revoked(token.token_hash)  # this process's memory of it (core/tokens.py)
            _audit(actor, "token.revoked", "token", token.prefix, kind=token.kind, name=token.name)
    return len(tokens)


def delete_token(*, actor: Actor, token_id: int) -> None:
    """Delete a token row (the admin's delete). Like a revocation it is final, and audited."""
    with _change(actor, "token.delete", "token", token_id):
        token = ApiToken.objects.select_for_update().filter(pk=token_id).first()
        if token is None:
            raise NotFound(f"no token {token_id}", object="token")
        token.delete()
        forget_revoked(token.token_hash)
        _audit(actor, "token.deleted", "token", token.prefix, kind=token.kind, name=token.name)


def ensure_roles(*, actor: Actor) -> list[str]:
    """Create the role groups that are missing; returns the ones created (audited if any)."""
    with _change(actor, "roles.create", "role", "all"):
        created = [name for name in ROLES if Group.objects.get_or_create(name=name)[1]]
        if created:
            # the names go in the context: all six joined overflow the 64-character object id
            target = created[0] if len(created) == 1 else "all"
            _audit(actor, "roles.created", "role", target, roles=created)
    return created


def set_user_roles(*, actor: Actor, user, roles: Iterable[str]) -> tuple[list[str], list[str]]:
    """Make ``roles`` exactly the user's roles. Returns (before, after); audited when they differ.
    Groups that are not roles are left as they are."""
    wanted = sorted(set(roles))
    with _change(actor, "user.set_roles", "user", user.get_username()):
        unknown = [r for r in wanted if r not in ROLES]
        if unknown:
            raise Invalid(f"unknown role(s) {unknown}; one of {ROLES}", field="roles")
        before = _roles(user)
        others = list(user.groups.exclude(name__in=ROLES))
        user.groups.set([*others, *(Group.objects.get_or_create(name=r)[0] for r in wanted)])
        if before != wanted:
            _audit(
                actor, "user.roles_set", "user", user.get_username(), before=before, after=wanted
            )
    return before, wanted


def create_user(
    *, actor: Actor, username: str, password: str, roles: Iterable[str] = (), staff: bool = False
):
    """A new login with its roles, audited (that a password was set, never the password)."""
    with _change(actor, "user.create", "user", username):
        user = get_user_model().objects.create_user(
            username, password=password, is_staff=staff, is_superuser=staff
        )
        _audit(actor, "user.created", "user", username, staff=staff)
        set_user_roles(actor=actor, user=user, roles=roles)
    return user
