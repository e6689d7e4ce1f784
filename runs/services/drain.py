"""The drain: the moment a pausing or cancelling run has nothing in flight left and reaches paused or
cancelled. Recorded as its own fact (a ``drained`` history link and a ``run.drained`` audit event) in
the transaction that completes it, so a receipt and the run page can say when the run stopped and
what settled after the operator asked (docs/operator/console.md, "Previews and receipts")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from audit.services import record_audit
from core.actors import Actor
from runs.models import Effect, Run
from runs.states import State

from .history import append_history

# (state the operator's intervention put the run in, the state its drain ends in)
DRAINS = {State.PAUSING.value: State.PAUSED.value, State.CANCELLING.value: State.CANCELLED.value}


def is_drain(previous: str, now: str) -> bool:
    return DRAINS.get(previous) == now


def record_drain(run: Run, *, previous: str, asked_at: datetime, event: str, actor: Actor) -> None:
    """Caller holds the run lock, inside the transaction that moved ``run`` out of ``previous``
    (entered at ``asked_at``). Lists the effects that were in flight when the operator asked: how
    long after the ask each settled, or that it is still unresolved (a lease that ran out)."""
    settled, unresolved = [], []
    effects = Effect.objects.filter(
        run=run, decision=Effect.AUTHORIZED, declared_at__lte=asked_at
    ).filter(outcome_at__gte=asked_at) | Effect.objects.filter(
        run=run, decision=Effect.AUTHORIZED, status__in=Effect.UNRESOLVED
    )
    for e in effects.order_by("declared_at")[:50]:
        row = {
            "effect": str(e.pk),
            "tool": e.tool,
            "action": e.action,
            "idempotency_key": e.idempotency_key,
            "status": e.status,
        }
        if e.status in Effect.UNRESOLVED or e.outcome_at is None:
            unresolved.append(row)
        else:
            after = max((e.outcome_at - asked_at).total_seconds(), 0.0)
            settled.append(row | {"at": e.outcome_at.isoformat(), "after_s": round(after, 1)})
    data: dict[str, Any] = {
        "from": previous,
        "state": run.state,
        "event": event,
        "asked_at": asked_at.isoformat(),
        "drained_at": run.state_changed_at.isoformat(),
        "settled": settled,
        "unresolved": unresolved,
    }
    append_history(run, "drained", data, attempt=run.current_attempt_id, actor=actor)
    record_audit(
        actor=actor,
        action="run.drained",
        object_type="run",
        object_id=run.pk,
        run_id=run.pk,
        reason=f"{previous} → {run.state}: "
        + (f"{len(settled)} in-flight effect(s) settled" if settled else "nothing was in flight")
        + (f", {len(unresolved)} unresolved" if unresolved else ""),
        context=data,
    )
