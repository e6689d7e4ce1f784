"""Event times against the anchor trail (docs/security/audit-forgery.md).

The application's database role may append to a chain -- that is its job -- so it can append an event
that is correctly linked and hashed but dated in the past ("approval.decide by user:april, 5 h ago").
The chain alone cannot tell; time can:

- **monotonic per chain** (audit/chain/verify.py): an event dated more than
  ``AUDIT_CLOCK_TOLERANCE_S`` before the event it follows is ``backdated``;
- **bounded by the anchors**: an anchor signed every chain's head at its time ``T``; an event dated
  before ``T`` (less the tolerance: a transaction may commit a little after it took its time) must
  have been under that anchor. One that lies beyond the head the last anchor signed for its chain
  (or in a chain that anchor did not know) was written after the anchor and dated before it:
  ``backdated``, named with its chain, position, action and actor;
- **a trail that stops is a failure**: the newest anchor older than three intervals (``stale``), or
  a gap of more than three intervals between two anchors while events were written inside it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from audit.models import AuditChain, AuditEvent

MAX_REPORTED = 20


def tolerance() -> timedelta:
    return timedelta(seconds=getattr(settings, "AUDIT_CLOCK_TOLERANCE_S", 60))


def backdated_after_anchor(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events dated before the newest v2 anchor but not covered by the heads it signed."""
    state: dict[str, int] = {}
    latest: datetime | None = None
    for a in records:
        if a.get("v") != 2:
            continue
        for chain, seq, _ in a["heads"]:
            state[chain] = seq
        latest = datetime.fromisoformat(a["at"])
    if latest is None:
        return []
    bound = latest - tolerance()
    beyond = Q()
    for chain, head in AuditChain.objects.values_list("key", "seq"):
        if head > state.get(chain, 0):
            beyond |= Q(chain=chain, chain_seq__gt=state.get(chain, 0))
    if not beyond:
        return []
    late = AuditEvent.objects.filter(beyond, created_at__lt=bound).order_by("chain", "chain_seq")
    return [
        {
            "problem": "backdated",
            "chain": e.chain,
            "first_broken_seq": e.chain_seq,
            "detail": (
                f"{e.action} by {e.actor} is dated {e.created_at.isoformat()}, before the anchor of "
                f"{latest.isoformat()}, yet lies beyond the head that anchor signed for its chain "
                f"(seq {state.get(e.chain, 0)}): written after the anchor, dated before it"
            ),
        }
        for e in late[:MAX_REPORTED]
    ]


def trail_problem(
    records: list[dict[str, Any]], now: datetime | None = None
) -> dict[str, Any] | None:
    """A stale or gapped anchor trail, or None. Without a configured interval there is no trail."""
    interval = settings.ANCHOR_INTERVAL_S
    if not interval or not records:
        return None
    allowed = timedelta(seconds=3 * interval)
    times = sorted(datetime.fromisoformat(a["at"]) for a in records)
    now = now or timezone.now()
    if now - times[-1] > allowed:
        return {
            "problem": "anchor_stale",
            "chain": "",
            "first_broken_seq": None,
            "detail": f"the newest anchor is from {times[-1].isoformat()}, more than 3 intervals "
            f"({3 * interval} s) ago: anchoring stopped, or anchor lines were removed",
        }
    for before, after in zip(times, times[1:], strict=False):
        if (
            after - before > allowed
            and AuditEvent.objects.filter(
                created_at__gt=before + timedelta(seconds=interval), created_at__lt=after
            ).exists()
        ):
            return {
                "problem": "anchor_missing",
                "chain": "",
                "first_broken_seq": None,
                "detail": f"no anchor between {before.isoformat()} and {after.isoformat()} while "
                "events were written: anchor lines were removed, or anchoring stopped",
            }
    return None
