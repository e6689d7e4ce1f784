"""A JSON answer sent straight on an ASGI ``send``: for the layers that refuse a request before
Django sees it (the wire limits, the drain, the sync-view gate), so they build it one way."""

from __future__ import annotations

DRAINING_HEADER = b"x-controlplane-draining"  # the SDK's and HAProxy's "refused unread, resend"
RECONNECT_HEADER = b"x-controlplane-reconnect"


async def send_json(send, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    """``body`` (JSON, already encoded) with ``status`` and any ``headers`` beyond the content's."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
