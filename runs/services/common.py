"""Shared steps of every decision: lock, transition check, history append, snapshot, audit, notify."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.chain.append import appending
from audit.chain.hashing import GENESIS, link_hash, normalise
from audit.models import AuditEvent
from audit.services import audit_event, record_audit
from core import pg
from core.actors import Actor
from core.errors import Conflict, DomainError, NotFound
from core.live import announce
from core.pg.append import insert_and_update
from core.pg.rows import Extra, select_row, write_rows
from core.telemetry import annotate
from runs.integrity import history_fields, walk_history
from runs.models import (
    Approval,
    AuthorityGrant,
    Checkpoint,
    Effect,
    ExecutionLease,
    HistoryEvent,
    Run,
)
from runs.states import APPROVAL_LIVE_STATES, Event, State, transition
from runs.work import work_key

NOTIFY_CHANNEL = "cp_runs"


def lock_run(run_id: Any) -> Run:
    """Lock the run row for the rest of the transaction. Every decision about an existing run takes
    it before reading what it decides on, so decisions on one run are serialised by the database
    (pause vs declare, claim vs claim)."""
    # ``Run.objects.select_for_update().get(pk=run_id)`` without the compiler (core.rows): every
    # protocol call starts here. The run row only: joining the agent row into a FOR UPDATE would lock it
    # too, serialising every run of an agent and deadlocking against transactions whose deferred FK
    # check takes KEY SHARE on it at COMMIT. ``run.agent`` loads lazily where a decision needs it.
    run = select_row(Run, lock=True, pk=run_id)
    if run is None:
        raise NotFound(f"run {run_id} does not exist", object="run")
    return run


def append_history(
    run: Run,
    kind: str,
    data: dict[str, Any] | None = None,
    *,
    attempt=None,
    actor: Actor | None = None,
    run_updates: dict[str, Any] | None = None,
) -> HistoryEvent:
    """Append to the run's hash chain. Caller holds the run lock, so seq and head cannot race.
    ``run_updates``: further columns of the run row to write in the same UPDATE as the new head."""
    event = next_history(run, kind, data, attempt=attempt, actor=actor)
    # The event's INSERT and the run's head UPDATE in one round trip (see audit.dbutil).
    insert_and_update(event, Run, run.pk, {**(run_updates or {}), **history_head(run, event)})
    return event


def next_history(
    run: Run,
    kind: str,
    data: dict[str, Any] | None = None,
    *,
    attempt=None,
    actor: Actor | None = None,
) -> HistoryEvent:
    """The run's next history link, hashed but not written, and the run's head moved to it in memory:
    for decisions that write it together with their other rows (``core.rows.write_rows``, with
    ``history_head(run, event)`` in the run's UPDATE). Caller holds the run lock."""
    seq = run.history_seq + 1
    prev = run.history_head or GENESIS
    payload = normalise(data or {})
    # ``attempt`` may be an Attempt or its id: callers pass the id so no row is loaded just for this.
    attempt_id = getattr(attempt, "pk", attempt)
    event = HistoryEvent(
        run=run,
        seq=seq,
        kind=kind,
        attempt_id=attempt_id,
        actor=actor.label if actor else "",
        data=payload,
        created_at=timezone.now(),
        prev_hash=prev,
    )
    event.hash = link_hash(prev, history_fields(event))
    run.history_seq, run.history_head = seq, event.hash
    announce(run.pk, kind, fact_object(kind, payload))  # the console hears it after COMMIT
    return event


def fact_object(kind: str, data: dict[str, Any]) -> Any:
    """The object a history event is about (an effect, approval, intervention, plan, lease,
    checkpoint), named in the live hint so the page redraws that object only."""
    if kind == "checkpoint":
        return data.get("seq")
    for key in ("effect", "approval", "intervention", "plan", "lease", "job"):
        if isinstance(data.get(key), str):
            return data[key]
    return None


def history_head(run: Run, event: HistoryEvent) -> dict[str, Any]:
    """The run columns that record its chain's head after ``event``."""
    return {
        "history_seq": run.history_seq,
        "history_head": run.history_head,
        "updated_at": event.created_at,
    }


def verify_history(run: Run) -> dict[str, Any]:
    """Walk a run's history chain against its head; name the first broken link (runs.integrity)."""
    return walk_history(
        HistoryEvent.objects.filter(run=run).order_by("seq"), run.history_seq, run.history_head
    )


def latest_checkpoint(run: Run) -> Checkpoint | None:
    return Checkpoint.objects.filter(run=run).order_by("-seq").first()


def starting_checkpoint(run: Run) -> Checkpoint | None:
    """The checkpoint the next attempt starts from: the named one if set, else the latest."""
    return run.resume_checkpoint or latest_checkpoint(run)


def set_resume_point(run: Run, checkpoint: Checkpoint | None, *, claimable_after) -> None:
    """Where the next attempt starts, and from when it may be claimed (retry backoff; None = now).
    The one writer of both (retry, resume and recovery call it; a claim consumes them); caller holds
    the run lock."""
    run.resume_checkpoint, run.claimable_after = checkpoint, claimable_after
    Run.objects.filter(pk=run.pk).update(
        resume_checkpoint=checkpoint, claimable_after=claimable_after
    )


def end_lease(lease: ExecutionLease, status: str, why: str, now) -> None:
    """Release or expire an execution lease: the one writer of a lease's end (claim superseding a
    stale one, release, finish, expiry, a pause with nothing in flight); caller holds the run lock."""
    ExecutionLease.objects.filter(pk=lease.pk).update(**lease_end(lease, status, why, now))


def lease_end(lease: ExecutionLease, status: str, why: str, now) -> dict[str, Any]:
    """``end_lease`` in memory (and announced): the columns to write, for a caller that writes them
    with its other rows (``core.rows.write_rows``)."""
    lease.status, lease.ended_at, lease.end_reason = status, now, why
    announce(lease.run_id, "lease", lease.pk)
    return {"status": status, "ended_at": now, "end_reason": why}


def checkpoint_summary(cp: Checkpoint | None) -> dict[str, Any] | None:
    if cp is None:
        return None
    return {
        "id": cp.id,
        "seq": cp.seq,
        "step": cp.step,
        "state": cp.state,
        "hash": cp.hash,
        "created_at": cp.created_at.isoformat(),
    }


def authority_envelope(
    run: Run, grants: list[AuthorityGrant] | None = None
) -> list[dict[str, Any]]:
    """The run's grants as previews, receipts and snapshots show them; ``grants``: already in hand
    (a run being created), else read in grant order."""
    now = timezone.now()
    if grants is None:
        grants = list(AuthorityGrant.objects.filter(run=run).order_by("granted_at"))
    return [
        {
            "id": str(g.id),
            "scope": g.scope,
            "status": g.effective_status(now),
            "expires_at": g.expires_at.isoformat(),
        }
        for g in grants
    ]


def unresolved_effects(run: Run) -> list[dict[str, Any]]:
    """The run's unresolved effects (``Effect.objects.unresolved()``), as previews, receipts, audit
    context and guards name them."""
    rows = Effect.objects.filter(run=run).unresolved()
    return [
        {
            "id": str(e.id),
            "step": e.step,
            "tool": e.tool,
            "action": e.action,
            "idempotency_key": e.idempotency_key,
            "status": e.status,
        }
        for e in rows.order_by("declared_at")
    ]


def run_snapshot(run: Run, new_grants: list[AuthorityGrant] | None = None) -> dict[str, Any]:
    """What was known at a decision: recorded in audit context for run-control events.
    ``new_grants``: the run is being created with these grants (nothing else to read yet: no
    checkpoint, no effects, no people)."""
    if new_grants is not None:
        return {
            "state": run.state,
            "attempt": None,
            "fencing_token": run.fencing_token,
            "checkpoint": None,
            "authority": authority_envelope(run, new_grants),
            "unresolved_effects": [],
            "assignee": None,
            "decision_authority": None,
        }
    cp = starting_checkpoint(run)
    return {
        "state": run.state,
        "attempt": {"id": str(run.current_attempt_id), "number": run.attempt_count}
        if run.current_attempt_id
        else None,
        "fencing_token": run.fencing_token,
        "checkpoint": {"seq": cp.seq, "step": cp.step} if cp else None,
        "authority": authority_envelope(run),
        "unresolved_effects": unresolved_effects(run),
        "assignee": run.assignee.username if run.assignee else None,
        "decision_authority": run.decision_authority.username if run.decision_authority else None,
    }


def protocol_snapshot(run: Run) -> dict[str, Any]:
    """What a worker-protocol transition (claim, finish) decided on, from the locked run row alone:
    the audit context of the worker's own moves, without ``run_snapshot``'s five queries inside the
    write. The operator's moves keep the full snapshot (authority, unresolved effects, assignee)."""
    return {
        "state": run.state,
        "attempt": {"id": str(run.current_attempt_id), "number": run.attempt_count}
        if run.current_attempt_id
        else None,
        "fencing_token": run.fencing_token,
        "checkpoint_seq": run.checkpoint_seq,
        "history_seq": run.history_seq,
    }


def notify_run_changed(run: Run) -> None:
    """Wake long-polling heartbeats. pg_notify is transactional: delivered only if we commit."""
    if pg.enabled(connection):
        with connection.cursor() as cur:
            cur.execute(
                "SELECT " + ", ".join(["pg_notify(%s, %s)"] * len(_notices(run))),
                [value for notice in _notices(run) for value in notice],
            )
    announce(run.pk, "run")  # sent after COMMIT (core.live)


def _notices(run: Run) -> list[tuple[str, str]]:
    notices = [(NOTIFY_CHANNEL, str(run.pk))]
    if run.state == State.QUEUED:  # claimable: wake the workers long-polling for work
        notices.append((NOTIFY_CHANNEL, work_key(run.agent_id)))
    return notices


def notifying(run: Run) -> Extra:
    """``notify_run_changed(run)`` as part of a decision's one write statement (core.rows.write_rows):
    the NOTIFYs are calls in its final SELECT. Reads ``run.state`` when the statement is built."""

    def parts(prefix: str) -> tuple[list[str], list[Any], list[str], list[Any]]:
        notices = _notices(run)
        params = [value for notice in notices for value in notice]
        return [], [], ["pg_notify(%s, %s)"] * len(notices), params

    return Extra(
        parts=parts,
        done=lambda found: announce(run.pk, "run"),
        fallback=lambda: notify_run_changed(run),
    )


def apply_transition(
    run: Run,
    event: Event,
    *,
    actor: Actor,
    reason: str = "",
    data: dict[str, Any] | None = None,
    audit_action: str | None = None,
    audit_context: dict[str, Any] | None = None,
    snapshot: Callable[[Run], dict[str, Any]] | None = None,
) -> State:
    """Move the locked run along the table, with history and audit in the same transaction.
    ``snapshot``: what renders the audit's before/after (default ``run_snapshot``). The run's UPDATE,
    the history link, the audit event and the NOTIFY are one statement."""
    move = transition_rows(
        run,
        event,
        actor=actor,
        reason=reason,
        data=data,
        audit_action=audit_action,
        audit_context=audit_context,
        snapshot=snapshot,
    )
    write_rows([move.history], [(Run, run.pk, move.run_updates)], move.extras(run))
    if run.state not in APPROVAL_LIVE_STATES:
        supersede_pending_approvals(run, actor=actor, why=f"run {event.value}: now {run.state}")
    return move.target


@dataclass
class Move:
    """A transition decided but not written: the run's new columns, its history link, its audit."""

    target: State
    history: HistoryEvent
    audit: AuditEvent
    run_updates: dict[str, Any]

    def extras(self, run: Run) -> list[Extra]:
        """The audit append and the NOTIFY, to write with the rows (core.rows.write_rows)."""
        return [appending(self.audit), notifying(run)]


def transition_rows(
    run: Run,
    event: Event,
    *,
    actor: Actor,
    reason: str = "",
    data: dict[str, Any] | None = None,
    audit_action: str | None = None,
    audit_context: dict[str, Any] | None = None,
    snapshot: Callable[[Run], dict[str, Any]] | None = None,
) -> Move:
    """``apply_transition``'s decision, in memory: the run moves along the table (Conflict if it may
    not), and the rows that record it are returned for the caller to write with its own (claim and
    finish write theirs in one statement). Caller holds the run lock; the pending approvals a move out
    of an approval-live state supersedes are the caller's to supersede after writing."""
    snapshot = snapshot or run_snapshot
    edge = transition(run.state, event)
    if edge is None:
        raise Conflict(
            f"{event.value} is not allowed while the run is {run.state}",
            state=run.state,
            event=event.value,
        )
    before = snapshot(run) if audit_context is None else None
    previous = run.state
    run.state, run.state_changed_at = edge.target.value, timezone.now()
    history = next_history(
        run,
        "state_changed",
        {"from": previous, "to": run.state, "event": event.value, "reason": reason, **(data or {})},
        attempt=run.current_attempt_id,
        actor=actor,
    )
    context = (
        audit_context if audit_context is not None else {"before": before, "after": snapshot(run)}
    )
    context = {"from_state": previous, "to_state": run.state, "event": event.value, **context}
    audit = audit_event(
        actor=actor,
        action=audit_action or f"run.{event.value}",
        object_type="run",
        object_id=run.pk,
        run_id=run.pk,
        reason=reason,
        context=context,
    )
    updates = {"state": run.state, "state_changed_at": run.state_changed_at}
    return Move(edge.target, history, audit, updates | history_head(run, history))


def supersede_pending_approvals(
    run: Run, *, actor: Actor, why: str, pending: list[Any] | None = None
) -> list[str]:
    """A run that moved on (cancelled, retried, recovered, a new attempt) no longer waits for the
    decisions it asked for: each pending approval becomes ``superseded`` (history + audit), can no
    longer be approved and leaves the inbox. Caller holds the run lock. ``pending``: the ids of the
    run's pending approvals (newest first) if the caller read them under the lock already."""
    if pending is None:
        pending = list(
            Approval.objects.filter(run=run, status=Approval.PENDING).values_list("pk", flat=True)
        )
    if not pending:
        return []
    now = timezone.now()
    Approval.objects.filter(pk__in=pending, status=Approval.PENDING).update(
        status=Approval.SUPERSEDED, decided_at=now, decision_reason=why
    )
    for approval_id in pending:
        data = {"approval": str(approval_id), "status": Approval.SUPERSEDED, "why": why}
        append_history(
            run, "approval_superseded", data, attempt=run.current_attempt_id, actor=actor
        )
        record_audit(
            actor=actor,
            action="approval.superseded",
            object_type="approval",
            object_id=approval_id,
            run_id=run.pk,
            reason=why,
            context={**data, "run_state": run.state},
        )
    return [str(a) for a in pending]


@contextmanager
def decision(
    actor: Actor, action: str, object_type: str, object_id: Any, run_id: Any = None
) -> Iterator[None]:
    """One transaction per decision. A refused decision rolls back, then is audited on its own.

    Durable: a decision is never a savepoint inside someone else's transaction (its COMMIT is when the
    run lock, the audit-head lock and pg_notify take effect), so opening one inside an atomic block
    is a programming error Django raises on. Test cases' own wrapping transactions are exempt."""
    ids = {f"{object_type}_id": object_id, "action": action}
    if run_id is not None:
        ids["run_id"] = run_id
    annotate(**ids)
    try:
        with transaction.atomic(durable=True):
            yield
    except DomainError as err:
        record_audit(
            actor=actor,
            action=action,
            object_type=object_type,
            object_id=object_id,
            run_id=run_id if _is_uuid(run_id) else None,
            outcome=AuditEvent.DENIED,
            reason=f"{err.code}: {err.detail}",
            context=err.payload(),
        )
        raise


def _is_uuid(value: Any) -> bool:
    import uuid

    try:
        uuid.UUID(str(value))
        return True
    except (ValueError, TypeError):
        return False


def lease_ttl() -> int:
    return settings.LEASE_TTL_S
