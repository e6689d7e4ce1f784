"""A late outcome that contradicts a reconciliation: an outcome is always recorded (docs/concepts/worker-protocol.md).

The reconciler (or an operator) concluded ``committed`` or ``failed`` from the evidence it had; the
worker then reports the opposite. Neither fact is thrown away: the reconciliation stays on the
effect, the worker's report is stored beside it, and the effect becomes ``discrepancy`` -- shown on
the run page as needing an operator, and offered for compensation by the compensation plan.
"""

from __future__ import annotations

from typing import Any

from audit.services import record_audit
from core.actors import Actor
from runs.models import Effect, Run

from .decisions import notify_run_changed
from .history import append_history


def reported_again(effect: Effect, status: str, external_ref: str) -> bool:
    """The same contradicting report a second time (an SDK retry): nothing new to record."""
    seen = effect.discrepancy or {}
    return seen.get("reported") == status and external_ref in ("", seen.get("external_ref", ""))


def record_discrepancy(
    run: Run,
    effect: Effect,
    *,
    actor: Actor,
    status: str,
    external_ref: str,
    detail: dict | None,
    fencing_token: int | None,
    now,
) -> Effect:
    """Caller holds the run lock and the effect row lock."""
    effect.discrepancy = {
        "reported": status,
        "reconciled": effect.status,
        "reconciled_by": (effect.reconciliation or {}).get("by"),
        "external_ref": external_ref,
        "detail": detail or {},
        "reported_by": actor.label,
        "fencing_token": fencing_token,
        "run_state": run.state,
        "at": now.isoformat(),
        "needs": "an operator: the world and the ledger disagree; compensate or reconcile with evidence",
    }
    was = effect.status
    effect.status, effect.late = Effect.DISCREPANCY, True
    effect.external_ref = effect.external_ref or external_ref
    effect.save(update_fields=["status", "late", "external_ref", "discrepancy"])
    data: dict[str, Any] = {
        "effect": str(effect.pk),
        "reported": status,
        "reconciled": was,
        "external_ref": external_ref,
    }
    append_history(run, "effect_discrepancy", data, attempt=run.current_attempt_id, actor=actor)
    record_audit(
        actor=actor,
        action="effect.discrepancy",
        object_type="effect",
        object_id=effect.pk,
        run_id=run.pk,
        reason=f"late outcome {status} contradicts reconciled {was}",
        context={
            **data,
            "idempotency_key": effect.idempotency_key,
            "reconciliation": effect.reconciliation,
            "state": run.state,
            "fencing_token": fencing_token,
        },
    )
    notify_run_changed(run)
    return effect
