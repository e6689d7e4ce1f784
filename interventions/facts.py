"""Read-only facts that previews and receipts name: in-flight effects, grants, checkpoint, timers."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from core.errors import Invalid
from runs.models import AuthorityGrant, Checkpoint, Effect, Run, Timer
from runs.selectors import (
    checkpoint_summary,
    latest_checkpoint,
    starting_checkpoint,
)


def in_flight_effects(run: Run) -> list[dict[str, Any]]:
    return [
        {
            "id": str(e.pk),
            "step": e.step,
            "tool": e.tool,
            "action": e.action,
            "idempotency_key": e.idempotency_key,
            "status": e.status,
            "declared_at": e.declared_at.isoformat(),
            "note": "may still complete; its outcome will be recorded",
        }
        for e in Effect.objects.filter(
            run=run, decision=Effect.AUTHORIZED, status=Effect.IN_FLIGHT
        ).order_by("declared_at")
    ]


def committed_effects(run: Run) -> list[dict[str, Any]]:
    return [
        {
            "id": str(e.pk),
            "step": e.step,
            "tool": e.tool,
            "action": e.action,
            "idempotency_key": e.idempotency_key,
            "external_ref": e.external_ref,
            "irreversible": e.irreversible,
            "compensation": None if e.irreversible else e.compensation,
            "compensation_status": e.compensation_status or None,
            "status": "committed (remains committed)",
        }
        for e in Effect.objects.filter(
            run=run, kind=Effect.ACTION, status=Effect.COMMITTED
        ).order_by("declared_at")
    ]


def active_grants(run: Run) -> list[dict[str, Any]]:
    now = timezone.now()
    return [
        {
            "id": str(g.pk),
            "scope": g.scope,
            "status": g.effective_status(now),
            "expires_at": g.expires_at.isoformat(),
            "delegated_from": str(g.delegated_from_id) if g.delegated_from_id else None,
        }
        for g in AuthorityGrant.objects.filter(run=run)
        if g.effective_status(now) == AuthorityGrant.ACTIVE
    ]


def timers(run: Run) -> list[dict[str, Any]]:
    return [
        {
            "name": t.name,
            "fire_at": t.fire_at.isoformat(),
            "status": t.status,
            "note": "keeps running during a pause; if it fires it is recorded and delivered on resume",
        }
        for t in Timer.objects.filter(run=run, status__in=[Timer.PENDING, Timer.FIRED])
    ]


def resume_point(run: Run) -> dict[str, Any] | None:
    return checkpoint_summary(starting_checkpoint(run))


def deadline(run: Run) -> dict[str, Any] | None:
    if not run.deadline:
        return None
    return {
        "deadline": run.deadline.isoformat(),
        "passed": run.deadline <= timezone.now(),
        "note": "deadlines keep running during a pause",
    }


def chosen_checkpoint(run: Run, options: dict[str, Any]) -> Checkpoint | None:
    """``options.checkpoint_seq``'s checkpoint (retry, redrive), else the latest; a seq the run does
    not have is refused naming the option."""
    seq = options.get("checkpoint_seq")
    if seq is None:
        return latest_checkpoint(run)
    cp = Checkpoint.objects.filter(run=run, seq=seq).first() if isinstance(seq, int) else None
    if cp is None:
        raise Invalid(
            f"checkpoint {seq!r} does not exist for this run", field="options.checkpoint_seq"
        )
    return cp


def protection(e: Effect) -> tuple[bool, str]:
    """What keeps an effect its step repeats from happening twice in the world, in the operator's words."""
    key = e.idempotency_key
    if not key:
        return False, "UNPROTECTED: no idempotency key; the repeat would dispatch it again"
    if e.status == Effect.COMMITTED:
        return True, f"replays the recorded result under {key}: not dispatched again"
    if e.status in Effect.UNRESOLVED:
        return True, f"outcome unknown: reconciled first; the repeat then reuses {key}"
    return True, f"dispatched again under {key} (its last attempt {e.status})"


def re_executes(run: Run, cp: Checkpoint | None) -> list[dict[str, Any]]:
    """Every step that runs again from ``cp`` (``None``: the start), oldest first, with each effect
    it repeats and that effect's idempotency protection. The steps are those of the authorised
    effects declared after the checkpoint and of the later checkpoints (a step with no effect)."""
    effects = Effect.objects.filter(run=run, kind=Effect.ACTION, decision=Effect.AUTHORIZED)
    later = Checkpoint.objects.filter(run=run)
    if cp is not None:
        effects, later = effects.filter(declared_at__gt=cp.created_at), later.filter(seq__gt=cp.seq)
    steps: dict[str, list[dict[str, Any]]] = {}
    for e in effects.order_by("declared_at"):
        protected, note = protection(e)
        steps.setdefault(e.step, []).append(
            {
                "id": str(e.pk),
                "tool": e.tool,
                "action": e.action,
                "idempotency_key": e.idempotency_key,
                "status": e.status,
                "protected": protected,
                "protection": note,
            }
        )
    for step in later.order_by("seq").values_list("step", flat=True):
        steps.setdefault(step, [])
    return [{"step": s, "effects": rows} for s, rows in steps.items()]
