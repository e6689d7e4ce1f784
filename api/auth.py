"""Who is calling: worker tokens, personal operator tokens, or a browser session -> an Actor."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from ninja.errors import AuthenticationError
from ninja.security import APIKeyCookie, HttpBearer

from core import tokens
from core.actors import Actor
from core.auth import actor_for_user, request_meta
from core.pg.rows import select_row

LAST_USED_RESOLUTION = timedelta(seconds=60)


class TokenAuth(HttpBearer):
    """Bearer tokens; only their SHA-256 is stored. Revoked tokens are refused (a worker token
    remembered by this process: within API_TOKEN_CACHE_S of its revocation, see core/tokens.py)."""

    def authenticate(self, request: HttpRequest, token: str) -> Actor | None:
        from runs.models import ApiToken

        token_hash = ApiToken.hash_secret(token)
        known = tokens.recall(token_hash)
        if known is None:
            since = tokens.generation()
            # Through core.pg.rows, not the query compiler (token_hash is unique). Worker tokens have
            # no user; an operator token's user is loaded on first access below.
            row = select_row(ApiToken, token_hash=token_hash)
            if row is None or row.revoked_at is not None:
                return None
            if row.kind != ApiToken.WORKER:
                _touch(row.pk, row.last_used_at)
                if row.user is None or not row.user.is_active:  # operator tokens have a user
                    return None
                return actor_for_user(row.user, request, component="api", token_id=row.pk)
            known = tokens.KnownToken(
                pk=row.pk,
                name=row.name,
                agents=tuple(row.agents),
                last_used_at=row.last_used_at,
                read_at=time.monotonic(),
                team=row.team_id or 0,
            )
            tokens.remember(token_hash, known, since)
        known.last_used_at = _touch(known.pk, known.last_used_at)
        return Actor(
            kind="worker",
            name=known.name,
            role="worker",
            token_id=known.pk,
            agents=known.agents,
            teams=frozenset({known.team}),
            component="worker-api",
            **request_meta(request),
        )


def _touch(pk: int, last_used_at):
    """Record the token's use, coarsely: a write on every call would add a commit per request and
    make every worker sharing a token contend on one row. Returns the recorded time."""
    from runs.models import ApiToken

    now = timezone.now()
    if last_used_at is None or now - last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=pk).update(last_used_at=now)
        return now
    return last_used_at


class SessionAuth(APIKeyCookie):
    """The console's session; CSRF is enforced for unsafe methods by ninja's cookie auth.

    Only a request that *is* a session request is checked for CSRF: one that presents a bearer token
    is decided by that token alone, and one without a logged-in session has nothing to forge. So a
    bad or revoked token answers 401 on every method, never "CSRF check failed"."""

    param_name = "sessionid"

    def __init__(self) -> None:
        super().__init__(csrf=True)

    def __call__(self, request: HttpRequest) -> Actor | None:
        if request.headers.get("Authorization"):
            return None
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return super().__call__(request)

    def authenticate(self, request: HttpRequest, key: Any) -> Actor | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return actor_for_user(user, request, component="console")


API_AUTH = [TokenAuth(), SessionAuth()]


def caller(request: HttpRequest) -> Actor:
    """The Actor that API_AUTH accepted for this request (ninja stores it in ``request.auth``)."""
    actor = getattr(request, "auth", None)
    if not isinstance(actor, Actor):  # only a route declared with auth=None could get here
        raise AuthenticationError()
    return actor


def refuse(request: HttpRequest, detail: str):
    """An authenticated caller at an endpoint its kind or role may never use (a worker token at an
    operator endpoint, say): the refusal is a denied call, so it is audited before it is returned.
    Call from sync code only (inside ``sync_to_async`` in an async view): it writes to the database."""
    from audit.models import AuditEvent
    from audit.services import record_audit
    from core.errors import Forbidden

    record_audit(
        actor=caller(request),
        action="api.denied",
        object_type="endpoint",
        object_id=request.path[:64],
        outcome=AuditEvent.DENIED,
        reason=f"forbidden: {detail}",
        context={"method": request.method, "path": request.path},
    )
    return Forbidden(detail)
