"""Writing an anchor: the Merkle root over every chain head, read in one snapshot, signed and appended
to the sink (audit/anchors/__init__.py says what an anchor is)."""

from __future__ import annotations

import base64
import json
from typing import Any

from django.db import connection
from django.utils import timezone

from audit.registry import anchor_parts
from audit.services import snapshot
from core import pg

from . import heads
from .merkle import merkle_root
from .signing import key_id, signed_bytes, signing_key
from .sink import sink

VERSION = 2  # v1: the single chain's head (seq, hash); v2: the Merkle root over every chain's head
# Serialises anchor writers (beat and on-demand), so that each anchor's moved heads are relative to the
# anchor line before it. Audit writers never take it.
ANCHOR_LOCK = 0x61756469  # "audi"


class AnchorRefused(Exception):
    """The database's chain head disagrees with its own last row: signing it would bless tampering."""


def _previous_snapshot(target: Any) -> str | None:
    """The database snapshot the last anchor read its heads in: the heads that moved since are those
    whose last append's transaction it did not see."""
    if hasattr(target, "last"):
        last = target.last()
    else:  # a sink without a cheap last(): read through it
        last = None
        for _, text in target.lines():
            last = text
    try:
        record = json.loads(last) if last else None
    except ValueError:
        return None
    return record.get("snapshot") if isinstance(record, dict) else None


def current_heads(previous: str | None) -> dict[str, Any]:
    """Every chain head, read in one snapshot with the registered anchor parts; the root over them
    and the heads that moved since ``previous`` (all of them without one). Each moved head is checked
    against the row it points at first."""
    with snapshot():
        leaves, moved, db_snapshot = heads.read_heads(previous)
        refused = heads.contradicted_heads(moved)
        parts = {name: collect() for name, (collect, _) in anchor_parts().items()}
    if refused:
        raise AnchorRefused(
            f"the head of chain {refused[0]} does not match its last row: run audit_verify"
        )
    return {
        "root": merkle_root(leaves),
        "chains": len(leaves),
        "events": sum(seq for _, seq, _ in leaves),
        "heads": [list(leaf) for leaf in moved],
        "snapshot": db_snapshot,
        "parts": parts,
    }


def write_anchor() -> dict[str, Any]:
    """Sign the Merkle root over every chain head and append it to the sink; an idle database gets a
    fresh anchor too (with no moved heads)."""
    target = sink()
    with _anchor_lock():
        state = current_heads(_previous_snapshot(target))
        key = signing_key()
        record: dict[str, Any] = {
            "v": VERSION,
            "at": timezone.now().isoformat(),
            "key": key_id(key.public_key()),
            **state,
        }
        record["sig"] = base64.b64encode(key.sign(signed_bytes(record))).decode()
        target.append(json.dumps(record, sort_keys=True, separators=(",", ":")))
    return record


class _anchor_lock:
    """A session-level advisory lock, taken before the reading snapshot starts (so the snapshot is
    newer than the anchor written before it) and held until the line is appended."""

    def __enter__(self) -> None:
        if pg.enabled(connection):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(%s)", [ANCHOR_LOCK])

    def __exit__(self, *exc: object) -> None:
        if pg.enabled(connection):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [ANCHOR_LOCK])
