"""Who is calling, as an Actor: the connection's metadata and a user's roles. Shared by both edges."""

from __future__ import annotations

import uuid
from typing import TypedDict

from django.http import HttpRequest

from core.actors import Actor
from core.roles import primary_role, roles_of


class RequestMeta(TypedDict, total=False):
    """Where a call came from: the Actor fields of the same names."""

    source_ip: str
    user_agent: str
    request_id: str


def request_meta(request: HttpRequest) -> RequestMeta:
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    return {
        "source_ip": (
            forwarded.split(",")[0].strip() if forwarded else request.META.get("REMOTE_ADDR", "")
        )
        or "",
        "user_agent": request.META.get("HTTP_USER_AGENT", "")[:300],
        "request_id": request.META.get("HTTP_X_REQUEST_ID", "") or uuid.uuid4().hex,
    }


def actor_for_user(
    user, request: HttpRequest | None = None, component: str = "api", token_id: int | None = None
) -> Actor:
    roles = roles_of(user)
    meta: RequestMeta = request_meta(request) if request is not None else {}
    return Actor(
        kind="user",
        name=user.get_username(),
        role=primary_role(roles),
        user_id=user.pk,
        token_id=token_id,
        roles=roles,
        component=component,
        **meta,
    )
