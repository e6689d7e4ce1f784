"""The decision transaction: one durable transaction per decision, the run lock it takes first, the
move along the state table (runs/states.py) with its history link, audit event and NOTIFY written as
one statement, and the pending approvals a move supersedes. History links: runs/services/history.py;
what a decision reads (snapshots, checkpoints, effects): runs/selectors.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.chain.append import appending
from audit.models import AuditEvent
from audit.services import audit_event, record_audit
from core import pg
from core.actors import Actor
from core.errors import Conflict, DomainError, NotFound
from core.live import announce
from core.pg.rows import Extra, select_row, write_rows
from core.telemetry import annotate
from runs.models import Approval, HistoryEvent, Run
from runs.selectors import run_snapshot
from runs.states import APPROVAL_LIVE_STATES, Event, State, transition
from runs.work import NOTIFY_CHANNEL, work_key

from .drain import is_drain, record_drain
from .history import append_history, history_head, next_history


def lock_run(run_id: Any) -> Run:
    """Lock the run row for the rest of the transaction. Every decision about an existing run takes
    it before reading what it decides on, so decisions on one run are serialised by the database
    (pause vs declare, claim vs claim)."""
    # ``Run.objects.select_for_update().get(pk=run_id)`` without the compiler (core.pg.rows): every
    # protocol call starts here. The run row only: joining the agent row into a FOR UPDATE would lock it
    # too, serialising every run of an agent and deadlocking against transactions whose deferred FK
    # check takes KEY SHARE on it at COMMIT. ``run.agent`` loads lazily where a decision needs it.
    run = select_row(Run, lock=True, pk=run_id)
    if run is None:
        raise NotFound(f"run {run_id} does not exist", object="run")
    return run


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
    """``notify_run_changed(run)`` as part of a decision's one write statement (core.pg.rows.write_rows):
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
    previous, asked_at = run.state, run.state_changed_at
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
    drained_if(run, previous, asked_at, event, actor)
    if run.state not in APPROVAL_LIVE_STATES:
        supersede_pending_approvals(run, actor=actor, why=f"run {event.value}: now {run.state}")
    return move.target


def drained_if(run: Run, previous: str, asked_at: Any, event: Event, actor: Actor) -> None:
    """A move that completes a pause or a cancel records the drain in the same transaction."""
    if is_drain(previous, run.state):
        record_drain(run, previous=previous, asked_at=asked_at, event=event.value, actor=actor)


@dataclass
class Move:
    """A transition decided but not written: the run's new columns, its history link, its audit."""

    target: State
    history: HistoryEvent
    audit: AuditEvent
    run_updates: dict[str, Any]

    def extras(self, run: Run) -> list[Extra]:
        """The audit append and the NOTIFY, to write with the rows (core.pg.rows.write_rows)."""
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
