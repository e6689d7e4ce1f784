"""The WebSocket handshake's Origin must be this very site: same scheme, host and port.

channels' AllowedHostsOriginValidator compares the host only, so a page served from another port or
over plain http on the same host could open a socket riding the session cookie. Here the Origin is
compared with the origin the socket itself was opened on (its Host header and ws/wss scheme; the
X-Forwarded-Proto of a trusted proxy), whose host must be in ALLOWED_HOSTS, or matched exactly
against an entry of CSRF_TRUSTED_ORIGINS. Anything else, a missing or "null" Origin included, is
refused before the handshake completes (HTTP 403).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

from core.auth import is_trusted_proxy

DEFAULT_PORTS = {"http": "80", "https": "443"}
Origin = tuple[str, str, str]  # scheme, host, port


def parse_origin(value: str) -> Origin | None:
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if (
        scheme not in DEFAULT_PORTS
        or parts.username
        or parts.password
        or parts.path not in ("", "/")
    ):
        return None
    return _host_origin(scheme, parts.netloc)


def _host_origin(scheme: str, netloc: str) -> Origin | None:
    host, port = split_domain_port(netloc)
    if not host:
        return None
    return scheme, host, port or DEFAULT_PORTS[scheme]


def _headers(scope) -> dict[bytes, list[bytes]]:
    found: dict[bytes, list[bytes]] = {}
    for name, value in scope.get("headers", []):
        found.setdefault(name.lower(), []).append(value)
    return found


def own_origin(scope) -> Origin | None:
    """The origin this socket was opened on, or None when its Host is not one of ALLOWED_HOSTS."""
    headers = _headers(scope)
    hosts = headers.get(b"host", [])
    if len(hosts) != 1:
        return None
    netloc = hosts[0].decode("latin-1")
    secure = scope.get("scheme") in ("wss", "https")
    peer = (scope.get("client") or ("",))[0] or ""
    forwarded = headers.get(b"x-forwarded-proto", [])
    if forwarded and is_trusted_proxy(peer):
        secure = forwarded[-1].decode("latin-1").split(",")[-1].strip().lower() == "https"
    origin = _host_origin("https" if secure else "http", netloc)
    if origin is None or not validate_host(origin[1], settings.ALLOWED_HOSTS):
        return None
    return origin


def origin_allowed(scope) -> bool:
    values = _headers(scope).get(b"origin", [])
    if len(values) != 1:
        return False
    origin = parse_origin(values[0].decode("latin-1"))
    if origin is None:
        return False
    trusted = {parse_origin(entry) for entry in settings.CSRF_TRUSTED_ORIGINS if "*" not in entry}
    return origin == own_origin(scope) or origin in trusted


class SameOriginValidator:
    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
