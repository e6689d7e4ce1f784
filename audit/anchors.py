"""Signed checkpoints of the audit chains, kept outside the database.

A chain proves that its rows link to each other, but anyone who can write the table can also truncate
it, cut its tail, or rewrite rows and recompute every hash after them: the chains are not keyed. An
anchor (v2) is a global checkpoint: the Merkle root over every chain's head (chain, seq, hash), the
heads that moved since the previous anchor, and the time, signed with Ed25519 and appended to a sink
the database cannot reach (a directory by default). Replaying the anchors' heads in order rebuilds the
full set each root was computed over (a missing anchor line shows as a root that does not add up), and
``verify_anchors`` holds the database to every head it ever showed: an anchored (chain, seq, hash) that
is gone or different names the chain and the position where it stopped matching.

Anchors of the single chain before per-chain audit (v1: seq, hash) are checked against the ``legacy``
chain, as before. Guarantee: in every chain, rows up to the newest anchored head that still matches are
exactly as they were when anchored; rows after it are covered only by the chain itself (one interval).
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.utils import timezone
from django.utils.module_loading import import_string

from . import anchor_checks
from .chain import canonical
from .integrity import anchor_parts
from .merkle import merkle_root
from .services import snapshot

log = logging.getLogger(__name__)

VERSION = 2  # v1: the single chain's head (seq, hash); v2: the Merkle root over every chain's head
DOMAIN = (
    b"controlplane-audit-anchor\n"  # a signature over an anchor is never valid for anything else
)
FIELDS = ("v", "seq", "hash", "at", "key")  # v1, and "parts": what registered apps anchor with it
# Serialises anchor writers (beat and on-demand), so that each anchor's moved heads are relative to the
# anchor line before it. Audit writers never take it.
ANCHOR_LOCK = 0x61756469  # "audi"


class AnchorRefused(Exception):
    """The database's chain head disagrees with its own last row: signing it would bless tampering."""


# --- keys ------------------------------------------------------------------------------------------


def signing_key() -> Ed25519PrivateKey:
    """``ANCHOR_SIGNING_KEY``: inline PEM, or the path of a PEM file. Unset: ``var/`` holds a demo key,
    generated on first use (never in production, where the key must be provisioned)."""
    configured = settings.ANCHOR_SIGNING_KEY
    if configured.lstrip().startswith("-----BEGIN"):
        return _load_private(configured.encode())
    path = Path(configured or settings.ANCHOR_DEMO_KEY_FILE)
    if not path.exists():
        if configured or settings.PRODUCTION:
            raise ImproperlyConfigured(
                f"ANCHOR_SIGNING_KEY: no key at {path} (production needs a provisioned key)"
            )
        _generate(path)
    return _load_private(path.read_bytes())


def _load_private(pem: bytes) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured("ANCHOR_SIGNING_KEY is not an Ed25519 private key")
    return key


def _generate(path: Path) -> None:
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: two processes starting at once keep one key between them
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    log.warning(
        "generated a demo anchor signing key at %s: set ANCHOR_SIGNING_KEY for production", path
    )


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b16encode(raw).decode().lower()[:16]


def public_pem(public: Ed25519PublicKey) -> str:
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def verify_keys() -> dict[str, Ed25519PublicKey]:
    """``ANCHOR_VERIFY_KEYS``: PEM public key files (old keys stay listed after a rotation). Unset: the
    signing key's own public half, which is only as safe as the machine holding the private key."""
    keys = []
    for path in settings.ANCHOR_VERIFY_KEYS:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
        if not isinstance(key, Ed25519PublicKey):
            raise ImproperlyConfigured(f"ANCHOR_VERIFY_KEYS: {path} is not an Ed25519 public key")
        keys.append(key)
    if not keys:
        keys.append(signing_key().public_key())
    return {key_id(k): k for k in keys}


# --- the sink --------------------------------------------------------------------------------------


class DirectorySink:
    """One JSON line per anchor in ``ANCHOR_DIR/anchors.jsonl``, only ever opened O_APPEND: a line is
    written with one write() and fsynced, and nothing here rewrites, truncates or deletes the file."""

    filename = "anchors.jsonl"

    def __init__(self) -> None:
        self.path = Path(settings.ANCHOR_DIR) / self.filename

    def append(self, line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def last(self) -> str | None:
        """The last line, read from the end of the file (the writer needs only that one)."""
        if not self.path.exists():
            return None
        with self.path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            start = max(0, end - 65536)
            while True:
                fh.seek(start)
                chunk = fh.read(end - start)
                lines = [x for x in chunk.split(b"\n") if x.strip()]
                if start == 0 or len(lines) > 1:
                    return lines[-1].decode("utf-8", "replace") if lines else None
                start = max(0, start - 4 * (end - start))

    def lines(self) -> Iterator[tuple[int, str]]:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8", errors="replace") as fh:
            for number, text in enumerate(fh, start=1):
                if text.strip():
                    yield number, text


def sink() -> Any:
    """``ANCHOR_SINK``: dotted path of a class with ``append(line)`` and ``lines()`` (position, text)."""
    return import_string(settings.ANCHOR_SINK)()


def read_anchor_lines() -> Iterator[tuple[int, str]]:
    return sink().lines()


# --- writing ---------------------------------------------------------------------------------------


def signed_bytes(record: dict[str, Any]) -> bytes:
    if record.get("v") == 1:
        return DOMAIN + canonical(
            {**{k: record[k] for k in FIELDS}, "parts": record.get("parts") or {}}
        )
    return DOMAIN + canonical({k: v for k, v in record.items() if k != "sig"})


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
        leaves, moved, db_snapshot = anchor_checks.read_heads(previous)
        refused = anchor_checks.contradicted_heads(moved)
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
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(%s)", [ANCHOR_LOCK])

    def __exit__(self, *exc: object) -> None:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [ANCHOR_LOCK])


# --- verifying -------------------------------------------------------------------------------------


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
    mismatch = anchor_checks.first_mismatch(anchors, report)
    report |= _freshness(records)
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


def _freshness(anchors: list[dict[str, Any]]) -> dict[str, Any]:
    """A missing recent anchor is a warning (beat stopped, or someone stopped it), not a broken chain."""
    latest = max(datetime.fromisoformat(a["at"]) for a in anchors)
    interval = settings.ANCHOR_INTERVAL_S
    stale = bool(interval) and timezone.now() - latest > timedelta(seconds=3 * interval)
    return {"latest_at": latest.isoformat(), "stale": stale}
