"""Verifying every audit chain link by link, against its head row; the first broken link of each chain
is named with its chain and position.

Call inside one snapshot (``services.snapshot``): writers keep appending meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import groupby
from typing import Any

from django.conf import settings

from audit.models import AuditChain, AuditEvent

from .hashing import GENESIS, link_hash

MAX_REPORTED = 20


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    checked: int  # events walked, every chain
    head_seq: int  # events the chain heads account for (== checked when intact)
    first_broken_seq: int | None = None
    problem: str = ""  # edited | deleted | inserted | reordered | backdated
    detail: str = ""
    chain: str = ""  # the chain of the first broken link
    chains: int = 0
    broken: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()

    @property
    def summary(self) -> str:
        if self.ok:
            return f"{self.checked} events in {self.chains} chains intact"
        return (
            f"audit chain {self.chain} broken at seq {self.first_broken_seq}: {self.problem} "
            f"({self.detail})"
        )


def verify_chains(batch: int = 2000) -> ChainReport:
    heads = {key: (seq, h) for key, seq, h in AuditChain.objects.values_list("key", "seq", "hash")}
    broken: list[dict[str, Any]] = []
    checked = chains = 0
    head_total = sum(seq for seq, _ in heads.values())
    for key, events in groupby(_iter_events(batch), key=lambda e: e.chain):
        chains += 1
        head = heads.pop(key, None)
        walked, count = _walk(key, events, head)
        checked += count
        if walked:
            broken.append({"chain": key, **walked})
    for key, (seq, _) in sorted(heads.items()):  # chains whose every row is gone
        if seq:
            chains += 1
            broken.append(
                _broken(key, 1, "deleted", f"the chain's head says {seq} events, found 0")
            )
    if not broken:
        return ChainReport(True, checked, head_total, chains=chains)
    first = broken[0]
    return ChainReport(
        False,
        checked,
        head_total,
        first["first_broken_seq"],
        first["problem"],
        first["detail"],
        chain=first["chain"],
        chains=chains,
        broken=broken[:MAX_REPORTED],
    )


def _broken(chain: str, seq: int, problem: str, detail: str) -> dict[str, Any]:
    return {"chain": chain, "first_broken_seq": seq, "problem": problem, "detail": detail}


def _walk(
    key: str, events: Iterator[AuditEvent], head: tuple[int, str] | None
) -> tuple[dict[str, Any] | None, int]:
    """Walk one chain in position order; (first break or None, events walked).

    A broken ``prev_hash`` alone does not say what happened, so the walk looks one row back (the hash
    two links ago) and one row ahead to tell an edited, deleted, inserted or reordered row apart; the
    head (moved by every append) catches rows removed from, or appended behind, the end."""
    prev_hash, prev_prev, expected, checked = GENESIS, None, 1, 0
    prev_at, slack = None, timedelta(seconds=getattr(settings, "AUDIT_CLOCK_TOLERANCE_S", 60))
    event = next(events, None)
    while event is not None:
        following = next(events, None)
        if event.chain_seq != expected:
            kind = "deleted" if event.chain_seq > expected else "reordered"
            return _broken(
                key, expected, kind, f"expected seq {expected}, found {event.chain_seq}"
            ), checked
        if event.prev_hash != prev_hash:
            kind, seq = _broken_link(event, following, prev_hash, prev_prev)
            return _broken(
                key, seq, kind, f"seq {event.chain_seq} does not link to seq {event.chain_seq - 1}"
            ), checked
        if link_hash(event.prev_hash, event.hashed_fields()) != event.hash:
            return _broken(
                key,
                event.chain_seq,
                "edited",
                f"seq {event.chain_seq}'s stored hash does not match its content",
            ), checked
        if prev_at is not None and event.created_at < prev_at - slack:
            # Linked and hashed right, but dated before the event it follows: appended with a
            # made-up time (docs/security/audit-forgery.md).
            return _broken(
                key,
                event.chain_seq,
                "backdated",
                f"seq {event.chain_seq} ({event.action} by {event.actor}) is dated "
                f"{event.created_at.isoformat()}, before seq {event.chain_seq - 1} "
                f"({prev_at.isoformat()})",
            ), checked
        prev_prev, prev_hash, expected, checked = prev_hash, event.hash, expected + 1, checked + 1
        prev_at = event.created_at
        event = following
    if head is None:
        return _broken(key, 1, "inserted", "rows of a chain that has no head"), checked
    seq, head_hash = head
    if seq < checked:
        return _broken(
            key, seq + 1, "inserted", f"the chain's head says {seq} events, found {checked}"
        ), checked
    if seq > checked:
        return _broken(
            key, checked + 1, "deleted", f"the chain's head says {seq} events, found {checked}"
        ), checked
    if head_hash != prev_hash:
        return _broken(
            key,
            checked,
            "edited",
            f"seq {checked} was rewritten: its hash is not the one the chain's head recorded",
        ), checked
    return None, checked


def _broken_link(
    event: AuditEvent, following: AuditEvent | None, prev_hash: str, prev_prev: str | None
) -> tuple[str, int]:
    """``event`` does not link to the row before it: say why, and where the chain first went wrong."""
    seq, mine = event.chain_seq, AuditEvent.objects.filter(chain=event.chain)
    if prev_prev is not None and event.prev_hash == prev_prev:
        return "inserted", seq - 1  # it links past the previous row: that row was slipped in
    if mine.filter(hash=event.prev_hash, chain_seq__gt=seq).exists():
        return "reordered", seq  # it links to a row that now comes after it
    if following is not None and following.prev_hash == prev_hash:
        return "inserted", seq  # the chain carries on around it: it was slipped in
    if not mine.filter(hash=event.prev_hash).exists():
        if link_hash(event.prev_hash, event.hashed_fields()) == event.hash:
            return "edited", seq - 1  # intact, but its predecessor was rewritten (and rehashed)
        return "deleted", seq  # its predecessor is gone and the rows after it were renumbered
    return "reordered", seq


def _iter_events(batch: int) -> Iterator[AuditEvent]:
    """Every event in (chain, position) order, streamed (a server-side cursor on PostgreSQL)."""
    return AuditEvent.objects.order_by("chain", "chain_seq").iterator(chunk_size=batch)
