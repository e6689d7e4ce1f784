"""Verifying anchors: every signature, that the v2 anchors replay to their signed roots, and that the
database still holds every head they signed (audit/anchors/__init__.py says what an anchor is)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.utils import timezone

from audit.registry import anchor_parts

from . import heads, times
from .signing import signed_bytes, verify_keys


def parse_anchor(text: str, keys: dict[str, Ed25519PublicKey]) -> tuple[dict[str, Any] | None, str]:
    """(record, "") for a well-formed anchor with a valid signature, else (None, why)."""
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or record.get("v") not in (1, 2):
            return None, "unreadable"
        if record["v"] == 1 and (
            not isinstance(record["seq"], int) or not isinstance(record["hash"], str)
        ):
            return None, "unreadable"
        if record["v"] == 2 and (
            not isinstance(record["root"], str) or not _leaves_ok(record["heads"])
        ):
            return None, "unreadable"
        if not isinstance(record.get("parts", {}), dict):
            return None, "unreadable"
        sig = base64.b64decode(record["sig"], validate=True)
        datetime.fromisoformat(record["at"])
        key = keys.get(record["key"])
    except (ValueError, KeyError, TypeError):
        return None, "unreadable"
    if key is None:
        return None, "unknown_key"
    try:
        key.verify(sig, signed_bytes(record))
    except InvalidSignature:
        return None, "bad_signature"
    return record, ""


def _leaves_ok(heads: Any) -> bool:
    return isinstance(heads, list) and all(
        isinstance(h, list)
        and len(h) == 3
        and isinstance(h[0], str)
        and isinstance(h[1], int)
        and isinstance(h[2], str)
        for h in heads
    )


def verify_anchors(lines: Iterable[tuple[int, str]]) -> dict[str, Any]:
    """Check every anchor's signature, that the v2 anchors replay to their signed roots, and that the
    database still holds every anchored head.

    Call inside the snapshot the chains are verified in. The first anchored position that no longer
    matches is named with its chain; for a rewrite the change lies after the last anchored position
    below it that still matches."""
    keys = verify_keys()
    anchors, invalid = [], []
    for position, text in lines:
        record, why = parse_anchor(text, keys)
        if record is None:
            invalid.append({"line": position, "problem": why})
        else:
            anchors.append((position, record))
    report: dict[str, Any] = {"ok": True, "anchors": len(anchors), "invalid": invalid[:20]}
    if not anchors:
        return report | {"ok": False, "problem": "no_anchors", "summary": "no valid anchor found"}
    records = [a for _, a in anchors]
    mismatch = heads.first_mismatch(anchors, report)
    report |= _freshness(records)
    if not mismatch:  # events dated before an anchor yet not under it; a trail that stopped
        if late := times.backdated_after_anchor(records):
            mismatch = {**late[0], "problems": late, "summary": _summary(late[0])}
        elif trail := times.trail_problem(records):
            mismatch = {**trail, "summary": trail["detail"]}
    if mismatch:
        report |= {"ok": False, **mismatch}
    for name, (_, check) in anchor_parts().items():
        part = check([(a["at"], a["parts"][name]) for a in records if name in a.get("parts", {})])
        report[name] = part
        if not part["ok"]:
            report["ok"] = False
            report.setdefault("summary", part.get("summary", f"{name} no longer match"))
    if invalid:
        report["ok"] = False
        first = invalid[0]
        report.setdefault(
            "summary",
            f"{len(invalid)} anchor line(s) fail verification, first at line {first['line']}: "
            f"{first['problem']}",
        )
    return report


def _summary(problem: dict[str, Any]) -> str:
    return (
        f"{problem['problem']} in chain {problem['chain']} at seq {problem['first_broken_seq']} "
        f"({problem['detail']})"
    )


def _freshness(anchors: list[dict[str, Any]]) -> dict[str, Any]:
    """When the newest anchor was written; a stale one also fails the check (times.trail_problem)."""
    latest = max(datetime.fromisoformat(a["at"]) for a in anchors)
    interval = settings.ANCHOR_INTERVAL_S
    stale = bool(interval) and timezone.now() - latest > timedelta(seconds=3 * interval)
    return {"latest_at": latest.isoformat(), "stale": stale}
