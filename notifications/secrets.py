"""Channel secrets at rest: encrypted with a key derived from SECRET_KEY (Fernet: AES + HMAC), and
the mask every page and API answer shows instead."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    digest = hashlib.sha256(b"controlplane.notifications:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode() if secret else ""


def decrypt(stored: str) -> str:
    if not stored:
        return ""
    try:
        return _fernet().decrypt(stored.encode()).decode()
    except InvalidToken:  # SECRET_KEY changed since: the admin sets the secret again
        raise ValueError("the channel's secret cannot be read (SECRET_KEY changed?); set it again")


def mask(stored: str) -> str:
    """ "set (fingerprint)": enough to tell two keys apart, nothing to sign with."""
    if not stored:
        return "not set"
    try:
        fingerprint = hashlib.sha256(decrypt(stored).encode()).hexdigest()[:8]
    except ValueError:
        return "set (unreadable)"
    return f"set (sha256 {fingerprint}…)"


def mask_url(url: str) -> str:
    """A Slack incoming-webhook URL is a bearer of the right to post: scheme and host only."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/…" if rest else ""
