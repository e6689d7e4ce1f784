"""Signed checkpoints of the audit chain, kept outside the database.

The chain proves that rows link to each other, but anyone who can write the table can also truncate it,
cut its tail, or rewrite rows and recompute every hash after them: the chain is not keyed. An anchor
is the chain head (seq, hash) and the time, signed with Ed25519 and appended to a sink the database
cannot reach (a directory by default). ``verify_anchors`` then holds the database to every head it
ever showed: an anchored (seq, hash) that is gone or different names where the chain stopped matching.

Guarantee: rows up to the newest anchor whose (seq, hash) still matches are exactly as they were
when anchored. Rows after the newest anchor are covered only by the chain itself (one interval).
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
from django.db.models import Max
from django.utils import timezone
from django.utils.module_loading import import_string

from .chain import GENESIS, canonical
from .integrity import anchor_parts
from .models import AuditChainHead, AuditEvent
from .services import snapshot

log = logging.getLogger(__name__)

VERSION = 1
DOMAIN = (
    b"controlplane-audit-anchor\n"  # a signature over an anchor is never valid for anything else
)
FIELDS = ("v", "seq", "hash", "at", "key")  # and "parts": what registered apps anchor with the head


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
    return DOMAIN + canonical(
        {**{k: record[k] for k in FIELDS}, "parts": record.get("parts") or {}}
    )


def current_head() -> tuple[int, str, dict[str, Any]]:
    """The chain head, read in one snapshot with the registered anchor parts (e.g. the runs' history
    heads) and checked against the row it points at."""
    with snapshot():
        head = AuditChainHead.objects.filter(id=1).first()
        last = AuditEvent.objects.order_by("-seq").values_list("seq", "hash").first()
        parts = {name: collect() for name, (collect, _) in anchor_parts().items()}
    head_pair = (head.seq, head.hash) if head and head.seq else (0, GENESIS)
    last_pair = last or (0, GENESIS)
    if head_pair != last_pair:
        raise AnchorRefused(
            f"chain head says seq {head_pair[0]} but the last row is seq {last_pair[0]} "
            "(or their hashes differ): run audit_verify"
        )
    return (*head_pair, parts)


def write_anchor() -> dict[str, Any]:
    """Sign the current head and append it to the sink; an idle chain gets a fresh anchor too."""
    seq, head_hash, parts = current_head()
    key = signing_key()
    record: dict[str, Any] = {
        "v": VERSION,
        "seq": seq,
        "hash": head_hash,
        "at": timezone.now().isoformat(),
        "key": key_id(key.public_key()),
        "parts": parts,
    }
    record["sig"] = base64.b64encode(key.sign(signed_bytes(record))).decode()
    sink().append(json.dumps(record, sort_keys=True, separators=(",", ":")))
    return record


# --- verifying -------------------------------------------------------------------------------------


def parse_anchor(text: str, keys: dict[str, Ed25519PublicKey]) -> tuple[dict[str, Any] | None, str]:
    """(record, "") for a well-formed anchor with a valid signature, else (None, why)."""
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or record.get("v") != VERSION:
            return None, "unreadable"
        if not isinstance(record["seq"], int) or not isinstance(record["hash"], str):
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


def verify_anchors(lines: Iterable[tuple[int, str]]) -> dict[str, Any]:
    """Check every anchor's signature and that the database still holds its (seq, hash).

    Call inside the snapshot the chain is verified in. The first anchored position that no longer
    matches is named; for a rewrite the change lies after the last anchor below it that still matches.
    """
    keys = verify_keys()
    anchors, invalid = [], []
    for position, text in lines:
        record, why = parse_anchor(text, keys)
        if record is None:
            invalid.append({"line": position, "problem": why})
        else:
            anchors.append(record)
    report: dict[str, Any] = {"ok": True, "anchors": len(anchors), "invalid": invalid[:20]}
    if not anchors:
        return report | {"ok": False, "problem": "no_anchors", "summary": "no valid anchor found"}
    mismatch = _first_mismatch(anchors, report)
    report |= _freshness(anchors)
    if mismatch:
        report |= {"ok": False, **mismatch}
    for name, (_, check) in anchor_parts().items():
        part = check([(a["at"], a["parts"][name]) for a in anchors if name in a.get("parts", {})])
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


def _first_mismatch(anchors: list[dict[str, Any]], report: dict[str, Any]) -> dict[str, Any]:
    top = AuditEvent.objects.aggregate(top=Max("seq"))["top"] or 0
    first_at: dict[tuple[int, str], str] = {}
    for a in anchors:
        first_at.setdefault((a["seq"], a["hash"]), a["at"])
    stored = _stored_hashes(sorted({seq for seq, _ in first_at if seq > 0}))
    last_good = 0
    for seq, anchored in sorted(first_at):
        have = stored.get(seq) if seq > 0 else GENESIS
        if have == anchored:
            last_good = seq
            continue
        report["anchored_through"] = last_good
        return _describe(seq, anchored, have, top, last_good, first_at[(seq, anchored)])
    report["anchored_through"] = last_good
    report["unanchored_events"] = max(0, top - last_good)
    return {}


def _describe(
    seq: int, anchored: str, have: str | None, top: int, last_good: int, at: str
) -> dict[str, Any]:
    signed = f"the anchor of {at} signed seq {seq} ({anchored[:12]}…)"
    if have is None and top == 0:
        problem, first = "truncated", 1
        detail = f"the audit table is empty but {signed}"
    elif have is None and seq > top:
        problem, first = "tail_cut", top + 1
        detail = f"the chain ends at seq {top} but {signed}: seqs {top + 1}..{seq} were cut"
    elif have is None:
        problem, first = "deleted", seq
        detail = f"seq {seq} is missing but {signed}"
    else:
        problem, first = "rewritten", seq
        detail = (
            f"{signed}, the database holds {have[:12]}… there: rows {last_good + 1}..{seq} were "
            "changed and rehashed"
        )
    return {
        "first_broken_seq": first,
        "problem": problem,
        "changed_after_seq": last_good,
        "detail": detail,
        "summary": f"{problem} at seq {first} ({detail})",
    }


def _stored_hashes(seqs: list[int]) -> dict[int, str]:
    stored: dict[int, str] = {}
    for i in range(0, len(seqs), 1000):
        chunk = seqs[i : i + 1000]
        stored.update(AuditEvent.objects.filter(seq__in=chunk).values_list("seq", "hash"))
    return stored


def _freshness(anchors: list[dict[str, Any]]) -> dict[str, Any]:
    """A missing recent anchor is a warning (beat stopped, or someone stopped it), not a broken chain."""
    latest = max(datetime.fromisoformat(a["at"]) for a in anchors)
    interval = settings.ANCHOR_INTERVAL_S
    stale = bool(interval) and timezone.now() - latest > timedelta(seconds=3 * interval)
    return {"latest_at": latest.isoformat(), "stale": stale}
