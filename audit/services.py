"""Writing and verifying the audit chain. ``record_audit`` must be called inside the transaction of
the change it records: if the audit write fails, the change does not happen."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core import pg
from core.actors import Actor

from .chain.append import append, chain_for
from .chain.hashing import normalise
from .chain.verify import ChainReport, verify_chains
from .models import AuditEvent
from .registry import run_team


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
    # One statement: the INSERT and the move of this chain's head (audit/chain/append.py). The head row's
    # lock is that chain's alone: no global serialisation point.
    return append(
        audit_event(
            actor=actor,
            action=action,
            object_type=object_type,
            object_id=object_id,
            outcome=outcome,
            reason=reason,
            run_id=run_id,
            context=context,
        )
    )


def audit_event(
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
    """The event ``record_audit`` appends, not yet written: for a decision that writes it in the same
    statement as its other rows (``audit.chain.append.appending`` in ``core.pg.rows.write_rows``).

    An event of a run outside the actor's teams, written by someone holding the cross_team right,
    says so: ``context.cross_team = true`` (docs/operator/teams.md)."""
    if actor.cross_team and actor.teams is not None and run_id is not None:
        if "cross_team" not in (context or {}):
            team = run_team(run_id)
            if team is not None and team not in actor.teams:
                context = (context or {}) | {"cross_team": True}
    return AuditEvent(
        chain=chain_for(run_id),
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
    )


@contextmanager
def snapshot() -> Iterator[None]:
    """Read everything inside from one database snapshot.

    Verification reads the rows and then the chain head; writers keep appending meanwhile, so without
    one snapshot a row committed between the two reads looks like a broken chain. On PostgreSQL this is
    a REPEATABLE READ, READ ONLY transaction; inside an existing transaction (whose snapshot rules are
    the caller's) or on SQLite (whose transactions are serialised anyway) it reads as it is.
    """
    conn = transaction.get_connection()
    if conn.in_atomic_block or not pg.enabled(conn):
        yield
        return
    with transaction.atomic():
        with conn.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def verify_chain(batch: int = 2000) -> ChainReport:
    """Walk every chain in one snapshot and name the first broken link (audit/chain/verify.py)."""
    with snapshot():
        return verify_chains(batch)


def export_jsonl(stream, since_seq: int = 0, scope: Q | None = None) -> int:
    """One line per event in reading order (global ``seq`` after ``since_seq``). Each line carries what
    its link needs (the hashed fields, ``prev_hash``, ``hash``) under ``link``-checkable keys, plus
    ``order`` (the global seq). ``scope``: the events the reader may know of (audit_events)."""
    from .chain.hashing import canonical
    from .selectors import settled_seq

    # Up to the settled horizon: an export resumed from its last ``order`` must not have passed an
    # event still being committed (selectors.settled_seq).
    horizon = settled_seq(floor=since_seq)
    settled = (
        AuditEvent.objects.all() if horizon is None else AuditEvent.objects.filter(seq__lte=horizon)
    )
    if scope is not None:  # a team-limited reader: their teams' events only
        settled = settled.filter(scope)
    count, last = 0, since_seq
    while True:
        rows = list(settled.filter(seq__gt=last).order_by("seq")[:2000])
        if not rows:
            return count
        for event in rows:
            row = event.hashed_fields() | {
                "order": event.seq,
                "prev_hash": event.prev_hash,
                "hash": event.hash,
            }
            stream.write(canonical(row).decode() + "\n")
            count += 1
        last = rows[-1].seq
