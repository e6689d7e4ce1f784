"""Signed webhooks: how a receiver knows a notification came from this control plane, unchanged and
recently (docs/operations/notifications.md has the verifier in full).

Headers: ``X-Controlplane-Timestamp: <unix seconds>`` and
``X-Controlplane-Signature: v1=<hex HMAC-SHA256(key, "<timestamp>." + body)>``. A receiver recomputes
the HMAC over the raw body, compares in constant time and refuses a timestamp outside its replay
window (default 300 s), so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

TIMESTAMP = "X-Controlplane-Timestamp"
SIGNATURE = "X-Controlplane-Signature"
REPLAY_WINDOW_S = 300


def signature(key: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def sign(key: str, body: bytes, *, now: float | None = None) -> dict[str, str]:
    ts = int(now if now is not None else time.time())
    return {TIMESTAMP: str(ts), SIGNATURE: signature(key, ts, body)}


def verify(
    key: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
    window_s: int = REPLAY_WINDOW_S,
) -> bool:
    """True only for a body signed with ``key`` within ``window_s`` of ``now``."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        ts = int(lowered.get(TIMESTAMP.lower(), ""))
    except ValueError:
        return False
    if abs((now if now is not None else time.time()) - ts) > window_s:
        return False
    return hmac.compare_digest(signature(key, ts, body), lowered.get(SIGNATURE.lower(), ""))
