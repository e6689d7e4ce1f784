"""Request-line and header limits with a real answer (docs/security.md, "Input limits").

twisted (under daphne) refuses a header block over 16 KiB, or any line over 16 KiB, by writing a bare
400 and dropping the connection while the client is still sending: the client usually sees the
connection reset and no answer at all. So twisted's ceilings are raised to 64 KiB and the promised
limits are kept here, in front of the application, with a JSON 400 naming what was too large:
headers over ``HEADER_LIMIT`` bytes, a URL (path and query) over ``URL_LIMIT``. Past twisted's ceiling
the connection is still dropped; nothing that large is a request anyone meant.
"""

from __future__ import annotations

import json

from controlplane.answer import send_json

HEADER_LIMIT = 16 * 1024
URL_LIMIT = 8 * 1024
TWISTED_CEILING = 64 * 1024


def widen_twisted_limits() -> None:
    try:
        from twisted.web import http
    except ImportError:  # not under daphne
        return
    http.HTTPChannel.totalHeadersSize = max(http.HTTPChannel.totalHeadersSize, TWISTED_CEILING)
    http.HTTPChannel.MAX_LENGTH = max(http.HTTPChannel.MAX_LENGTH, TWISTED_CEILING)


def refusal(scope: dict) -> tuple[str, str] | None:
    """(field, detail) if the request's URL or headers exceed the limits, else None."""
    url = len(scope.get("raw_path") or scope.get("path", "").encode()) + len(
        scope.get("query_string") or b""
    )
    if url > URL_LIMIT:
        return "url", f"the URL is {url} bytes; at most {URL_LIMIT} are accepted"
    size = sum(len(k) + len(v) + 4 for k, v in scope.get("headers") or ())
    if size > HEADER_LIMIT:
        return (
            "headers",
            f"the request headers are {size} bytes; at most {HEADER_LIMIT} are accepted",
        )
    return None


class WireLimits:
    """ASGI middleware: a JSON 400 for an over-long URL or header block, before anything reads it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (problem := refusal(scope)):
            field, detail = problem
            body = json.dumps({"error": "too_large", "detail": detail, "field": field}).encode()
            await send_json(send, 400, body)
            return
        await self.app(scope, receive, send)
