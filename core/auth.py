"""Who is calling, as an Actor: the connection's metadata and a user's roles. Shared by both edges.

Where a request comes from is the connection's peer (REMOTE_ADDR) and its id is generated here,
unless the peer is a reverse proxy listed in settings.TRUSTED_PROXIES: only then are its
X-Forwarded-For and X-Request-ID believed. Anyone can send those headers; believing them from anyone
would let a client write whatever source address and request id it likes into the audit chain (and
pick the IP that login throttling counts against).
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from functools import lru_cache
from typing import TypedDict

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from core.actors import Actor
from core.roles import may, primary_role, roles_of

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_META_REQUEST_ID = "controlplane.request_id"  # one id per request, however often it is asked for


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[_Network, ...]:
    try:
        return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)
    except ValueError as exc:
        raise ImproperlyConfigured(f"TRUSTED_PROXIES: {exc}") from None


def trusted_networks() -> tuple[_Network, ...]:
    return _networks(tuple(getattr(settings, "TRUSTED_PROXIES", ()) or ()))


def _parse_ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value.strip())
    except ValueError:
        return None


def is_trusted_proxy(addr: str) -> bool:
    ip = _parse_ip(addr or "")
    return ip is not None and any(ip in net for net in trusted_networks())


def client_ip_from(peer: str, forwarded_for: str) -> str:
    """The client's address: the peer, or — when the peer is a trusted proxy — the first address in
    X-Forwarded-For, read from the right, that is not itself a trusted proxy (the left part of the
    header is whatever the client wrote; only the hops our proxies appended can be believed)."""
    if not forwarded_for or not is_trusted_proxy(peer):
        return peer or ""
    client = peer
    for hop in reversed([part.strip() for part in forwarded_for.split(",")]):
        if _parse_ip(hop) is None:
            break  # garbage in the chain: stop at the last hop a trusted proxy vouched for
        client = hop
        if not is_trusted_proxy(hop):
            break
    return client


def client_ip(request: HttpRequest) -> str:
    """Also django-axes' AXES_CLIENT_IP_CALLABLE: login throttling counts the same address."""
    meta = request.META
    return client_ip_from(meta.get("REMOTE_ADDR", "") or "", meta.get("HTTP_X_FORWARDED_FOR", ""))


def request_id(request: HttpRequest) -> str:
    meta = request.META
    if _META_REQUEST_ID not in meta:
        given = meta.get("HTTP_X_REQUEST_ID", "").strip()
        trusted = is_trusted_proxy(meta.get("REMOTE_ADDR", ""))
        ok = trusted and _REQUEST_ID.fullmatch(given) is not None
        meta[_META_REQUEST_ID] = given if ok else uuid.uuid4().hex
    return meta[_META_REQUEST_ID]


class RequestMeta(TypedDict, total=False):
    """Where a call came from: the Actor fields of the same names."""

    source_ip: str
    user_agent: str
    request_id: str


def request_meta(request: HttpRequest) -> RequestMeta:
    return {
        "source_ip": client_ip(request),
        # Recorded in audit rows: a NUL cannot be stored in PostgreSQL text (a hostile header).
        "user_agent": request.META.get("HTTP_USER_AGENT", "").replace("\x00", "")[:300],
        "request_id": request_id(request),
    }


def actor_for_user(
    user, request: HttpRequest | None = None, component: str = "api", token_id: int | None = None
) -> Actor:
    roles = roles_of(user)
    meta: RequestMeta = request_meta(request) if request is not None else {}
    return Actor(
        teams=teams_of(user),
        cross_team=may(roles, "cross_team"),
        kind="user",
        name=user.get_username(),
        role=primary_role(roles),
        user_id=user.pk,
        token_id=token_id,
        roles=roles,
        component=component,
        **meta,
    )


DEFAULT_TEAM = "default"  # runs.models.teams.DEFAULT_TEAM (the kernel imports no app)


def teams_of(user) -> frozenset[int]:
    """The ids of the user's teams, 0 for the default team (no membership at all = the default
    team). Read through the reverse relation of runs.TeamMembership: one query per call."""
    if getattr(user, "pk", None) is None:
        return frozenset({0})
    rows = user.team_memberships.values_list("team_id", "team__slug")
    return frozenset(0 if slug == DEFAULT_TEAM else pk for pk, slug in rows) or frozenset({0})
