"""Stop waiting for the worker (the terminate contract, interventions/terminate.py): inside the
decision's transaction, run locked. Its execution lease ends now instead of at expiry, so whatever the
worker writes afterwards is fenced out, and each effect it had in flight becomes ``unknown``: the
worker may or may not have sent it, and nobody will say so on its behalf. Those stay unknown until
reconciled (docs/concepts/contracts.md#reconcile); an outcome the worker still reports is recorded
(flagged late and stale)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor
from runs.models import Effect, Run

from .history import append_history
from .lifecycle import end_live_leases


def in_flight(run: Run) -> list[Effect]:
    return list(
        Effect.objects.filter(
            run=run, decision=Effect.AUTHORIZED, status=Effect.IN_FLIGHT
        ).order_by("declared_at")
    )


def stop_waiting(run: Run, actor: Actor, why: str) -> dict[str, Any]:
    """End the run's live leases and mark its in-flight effects unknown, each with history and audit.
    Returns what was ended and which effects became unknown (the receipt names them)."""
    now = timezone.now()
    leases = end_live_leases(run, f"terminated by {actor.label}: {why}", now=now)
    became = []
    for effect in in_flight(run):
        detail = {"unknown_because": f"terminated by {actor.label}: {why}", "at": now.isoformat()}
        updated = Effect.objects.filter(pk=effect.pk, status=Effect.IN_FLIGHT).update(
            status=Effect.UNKNOWN, outcome_at=now, outcome_detail=detail
        )
        if not updated:
            continue
        facts = {
            "effect": str(effect.pk),
            "tool": effect.tool,
            "action": effect.action,
            "idempotency_key": effect.idempotency_key,
            "status": Effect.UNKNOWN,
            "why": "terminated: the worker's answer will not be waited for",
        }
        append_history(run, "effect_unknown", facts, attempt=run.current_attempt_id, actor=actor)
        record_audit(
            actor=actor,
            action="effect.unknown",
            object_type="effect",
            object_id=effect.pk,
            run_id=run.pk,
            reason=why,
            context=facts,
        )
        became.append(facts | {"step": effect.step, "declared_at": effect.declared_at.isoformat()})
    return {"leases_ended": leases, "became_unknown": became}
