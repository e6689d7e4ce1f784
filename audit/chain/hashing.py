"""Canonical bytes and hashes for the audit chain and run history chains."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

GENESIS = "0" * 64


def _default(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def canonical(payload: dict[str, Any]) -> bytes:
    """Stable bytes: sorted keys, no whitespace, datetimes as ISO 8601, UUIDs as strings."""
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), default=_default, ensure_ascii=False
    ).encode()


def link_hash(prev_hash: str, payload: dict[str, Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + b"\n" + canonical(payload)).hexdigest()


def normalise(value: Any) -> Any:
    """What a JSON column gives back, so a hash computed before saving equals one computed after."""
    return json.loads(canonical({"v": value}))["v"]
