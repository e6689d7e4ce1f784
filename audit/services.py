"""Writing and verifying the audit chain. ``record_audit`` must be called inside the transaction of
the change it records: if the audit write fails, the change does not happen."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.actors import Actor
from core.rows import select_row

from .chain import GENESIS, link_hash, normalise
from .dbutil import insert_and_update
from .models import AuditChainHead, AuditEvent


def record_audit(
    *,
    actor: Actor,
    action: str,
    object_type: str,
    object_id: Any,
    outcome: str = AuditEvent.ALLOWED,
    reason: str = "",
    run_id: Any = None,
    context: dict[str, Any] | None = None,
) -> AuditEvent:
    if not transaction.get_connection().in_atomic_block:
        # A standalone audit row (e.g. a denial) still gets its own transaction.
        with transaction.atomic():
            return record_audit(
                actor=actor,
                action=action,
                object_type=object_type,
                object_id=object_id,
                outcome=outcome,
                reason=reason,
                run_id=run_id,
                context=context,
            )
    head_seq, head_hash = _lock_head()
    event = AuditEvent(
        seq=head_seq + 1,
        event_id=uuid.uuid4(),
        created_at=timezone.now(),
        actor_kind=actor.kind,
        actor=actor.name,
        role=actor.role,
        on_behalf_of=actor.on_behalf_of,
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        run_id=run_id,
        reason=reason or "",
        outcome=outcome,
        component=actor.component,
        source_ip=actor.source_ip[:64],
        user_agent=actor.user_agent[:300],
        request_id=actor.request_id[:64],
        context=normalise(context or {}),
        prev_hash=head_hash,
    )
    event.hash = link_hash(event.prev_hash, event.hashed_fields())
    # INSERT the event and move the head in one round trip: the head's lock is held until COMMIT and
    # serialises every audit writer, so each round trip saved under it counts.
    insert_and_update(event, AuditChainHead, 1, {"seq": event.seq, "hash": event.hash})
    return event


def _lock_head() -> tuple[int, str]:
    """Lock the chain head (``AuditChainHead`` id 1) FOR UPDATE and return its (seq, hash), creating it
    on first use: ``AuditChainHead.objects.select_for_update().get_or_create(id=1, defaults={"hash":
    GENESIS})``. Every audit writer queues here, so the common case goes through core.rows
    rather than the query compiler."""
    head = select_row(AuditChainHead, pk=1, lock=True)
    if head is None:
        head, _ = AuditChainHead.objects.select_for_update().get_or_create(
            id=1, defaults={"hash": GENESIS}
        )
    return head.seq, head.hash


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    checked: int
    head_seq: int
    first_broken_seq: int | None = None
    problem: str = ""  # edited | deleted | inserted | reordered
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@contextmanager
def snapshot() -> Iterator[None]:
    """Read everything inside from one database snapshot.

    Verification reads the rows and then the chain head; writers keep appending meanwhile, so without
    one snapshot a row committed between the two reads looks like a broken chain. On PostgreSQL this is
    a REPEATABLE READ, READ ONLY transaction; inside an existing transaction (whose snapshot rules are
    the caller's) or on SQLite (whose transactions are serialised anyway) it reads as it is.
    """
    conn = transaction.get_connection()
    if conn.in_atomic_block or conn.vendor != "postgresql":
        yield
        return
    with transaction.atomic():
        with conn.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def verify_chain(batch: int = 2000) -> ChainReport:
    """Walk the chain in seq order, in one snapshot, and name the first broken link."""
    with snapshot():
        return _verify_chain(batch)


def _verify_chain(batch: int) -> ChainReport:
    """Walk the chain in seq order and name the first broken link.

    A broken ``prev_hash`` alone does not say what happened, so the walk looks one row back (the hash
    two links ago) and one row ahead to tell an edited, deleted, inserted or reordered row apart; the
    chain head (kept by every writer) catches rows removed from, or appended behind, the end.
    """
    prev_hash, prev_prev, expected_seq, checked = GENESIS, None, 1, 0
    events = _iter_events(batch)
    event = next(events, None)
    while event is not None:
        following = next(events, None)
        if event.seq != expected_seq:
            kind = "deleted" if event.seq > expected_seq else "reordered"
            return ChainReport(
                False,
                checked,
                _head_seq(),
                expected_seq,
                kind,
                f"expected seq {expected_seq}, found {event.seq}",
            )
        if event.prev_hash != prev_hash:
            kind, seq = _broken_link(event, following, prev_hash, prev_prev)
            return ChainReport(
                False,
                checked,
                _head_seq(),
                seq,
                kind,
                f"event {event.seq} does not link to event {event.seq - 1}",
            )
        if link_hash(event.prev_hash, event.hashed_fields()) != event.hash:
            return ChainReport(
                False,
                checked,
                _head_seq(),
                event.seq,
                "edited",
                f"event {event.seq}'s stored hash does not match its content",
            )
        prev_prev, prev_hash, expected_seq, checked = (
            prev_hash,
            event.hash,
            expected_seq + 1,
            checked + 1,
        )
        event = following
    head = AuditChainHead.objects.filter(id=1).first()
    if head and head.seq < checked:
        return ChainReport(
            False,
            checked,
            head.seq,
            head.seq + 1,
            "inserted",
            f"chain head says {head.seq} events, found {checked}",
        )
    if head and head.seq > checked:
        return ChainReport(
            False,
            checked,
            head.seq,
            checked + 1,
            "deleted",
            f"chain head says {head.seq} events, found {checked}",
        )
    if head and head.hash != prev_hash:
        return ChainReport(
            False,
            checked,
            head.seq,
            checked,
            "edited",
            f"event {checked} was rewritten: its hash is not the one the chain head recorded",
        )
    return ChainReport(True, checked, checked)


def _broken_link(
    event: AuditEvent, following: AuditEvent | None, prev_hash: str, prev_prev: str | None
) -> tuple[str, int]:
    """``event`` does not link to the row before it: say why, and where the chain first went wrong."""
    if prev_prev is not None and event.prev_hash == prev_prev:
        return "inserted", event.seq - 1  # it links past the previous row: that row was slipped in
    if AuditEvent.objects.filter(hash=event.prev_hash, seq__gt=event.seq).exists():
        return "reordered", event.seq  # it links to a row that now comes after it
    if following is not None and following.prev_hash == prev_hash:
        return "inserted", event.seq  # the chain carries on around it: it was slipped in
    if not _hash_exists(event.prev_hash):
        if link_hash(event.prev_hash, event.hashed_fields()) == event.hash:
            return (
                "edited",
                event.seq - 1,
            )  # intact, but its predecessor was rewritten (and rehashed)
        return "deleted", event.seq  # its predecessor is gone and the rows after it were renumbered
    return "reordered", event.seq


def _iter_events(batch: int) -> Iterator[AuditEvent]:
    last = 0
    while True:
        rows = list(AuditEvent.objects.filter(seq__gt=last).order_by("seq")[:batch])
        if not rows:
            return
        yield from rows
        last = rows[-1].seq


def _head_seq() -> int:
    head = AuditChainHead.objects.filter(id=1).first()
    return head.seq if head else 0


def _hash_exists(value: str) -> bool:
    return AuditEvent.objects.filter(hash=value).exists()


def export_jsonl(stream, since_seq: int = 0) -> int:
    from .chain import canonical

    count = 0
    for event in _iter_events(2000):
        if event.seq <= since_seq:
            continue
        row = event.hashed_fields() | {"prev_hash": event.prev_hash, "hash": event.hash}
        stream.write(canonical(row).decode() + "\n")
        count += 1
    return count
