"""Signing anchors: the Ed25519 keys (the signing key, the keys verifiers trust) and the exact bytes an
anchor's signature covers (audit/anchors/__init__.py says what an anchor is)."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from audit.chain.hashing import canonical

log = logging.getLogger(__name__)

DOMAIN = (
    b"controlplane-audit-anchor\n"  # a signature over an anchor is never valid for anything else
)
FIELDS = ("v", "seq", "hash", "at", "key")  # v1, and "parts": what registered apps anchor with it


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


def signed_bytes(record: dict[str, Any]) -> bytes:
    if record.get("v") == 1:
        return DOMAIN + canonical(
            {**{k: record[k] for k in FIELDS}, "parts": record.get("parts") or {}}
        )
    return DOMAIN + canonical({k: v for k, v in record.items() if k != "sig"})
