"""The worker protocol's version (``X-Controlplane-Protocol``), checked before any /api/ call runs.

The SDK sends the version it speaks on every call (controlplane_sdk ``PROTOCOL_VERSION``). A call
without the header is served as version 1 (SDKs from before the header, curl): the protocol is still
the one it was. A version this server does not speak (an SDK newer than the server, or a retired one)
is refused with 400 ``protocol_version_unsupported`` naming the version sent and the ones spoken, so
the caller sees why instead of a call misread; nothing was done, so it is safe to upgrade and resend.
Every /api/ answer names the server's version in the same header.
"""

from __future__ import annotations

import json

from django.http import HttpResponse

HEADER = "X-Controlplane-Protocol"
CURRENT = 1
SPOKEN = frozenset({1})  # widen when a version is added; narrow when one is retired
API_PREFIX = "/api/"


class ProtocolVersionMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        sent = request.headers.get(HEADER)
        if sent is not None and _version(sent) not in SPOKEN:
            response = refusal(sent)
        else:
            response = self.get_response(request)
        response[HEADER] = str(CURRENT)
        return response


def _version(sent: str) -> int | None:
    text = sent.strip()
    return int(text) if text.isdigit() and len(text) <= 6 else None


def refusal(sent: str) -> HttpResponse:
    shown = sent.strip()[:20]
    spoken = sorted(SPOKEN)
    body = {
        "error": "protocol_version_unsupported",
        "detail": (
            f"this server speaks worker protocol version {', '.join(map(str, spoken))}; the client "
            f"sent {shown!r}. Nothing was done: use an SDK that speaks version {CURRENT}"
            + (
                " (upgrade the server for a newer protocol)"
                if (_version(sent) or 0) > CURRENT
                else ""
            )
        ),
        "field": "",
        "sent": shown,
        "supported": spoken,
    }
    return HttpResponse(json.dumps(body), status=400, content_type="application/json")
