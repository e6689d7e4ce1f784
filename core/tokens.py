"""Worker tokens this process has recently checked, so that a worker's every call does not look its
token up again. The staleness bound, for revocation (and deletion):

- the process that revokes a token (``forget_revoked``, called by the revoking service inside its
  transaction) drops it at once, and again when the revocation commits;
- every other process refuses it at most ``API_TOKEN_CACHE_S`` seconds (setting, default 2) after
  the revocation committed: an entry is trusted for that long after the row was read, then read
  again. That bound holds whatever revoked the token (the service, the admin, raw SQL).

``API_TOKEN_CACHE_S = 0`` turns the memory off (every call reads its token). Only worker tokens
are remembered: an operator token acts as its user, whose roles and active flag are read per call.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction

MAX_KNOWN = 10_000


@dataclass(slots=True)
class KnownToken:
    """What a worker's call needs of its token row (a worker token's name and agents never change)."""

    pk: int
    name: str
    agents: tuple[str, ...]
    last_used_at: datetime | None
    read_at: float  # time.monotonic() when the row was read
    team: int = 0  # the token's team id, 0 = the default team (a token's team never changes)


_known: dict[str, KnownToken] = {}
_lock = threading.Lock()
_generation = [0]  # bumped by every forget: a read that started before it is not remembered


def ttl_s() -> float:
    return float(getattr(settings, "API_TOKEN_CACHE_S", 2))


def generation() -> int:
    return _generation[0]


def recall(token_hash: str) -> KnownToken | None:
    """The remembered token, if it was read less than API_TOKEN_CACHE_S ago."""
    known = _known.get(token_hash)
    if known is not None and time.monotonic() - known.read_at < ttl_s():
        return known
    return None


def remember(token_hash: str, known: KnownToken, since_generation: int) -> None:
    """Keep ``known`` (read after ``generation()`` returned ``since_generation``), unless a token
    was forgotten meanwhile: that read may predate the revocation."""
    if ttl_s() <= 0:
        return
    with _lock:
        if _generation[0] != since_generation:
            return
        if len(_known) >= MAX_KNOWN:
            _known.clear()
        _known[token_hash] = known


def forget(token_hash: str | None = None) -> None:
    """Drop one token (or all, with None)."""
    with _lock:
        _generation[0] += 1
        if token_hash is None:
            _known.clear()
        else:
            _known.pop(token_hash, None)


def forget_revoked(token_hash: str) -> None:
    """For the service revoking or deleting a token, inside its transaction: forgotten now, and
    again once the change commits (a call that read the row before the commit cannot keep it)."""
    forget(token_hash)
    transaction.on_commit(lambda: forget(token_hash))
