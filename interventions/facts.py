"""Read-only facts that previews and receipts name: in-flight effects, grants, checkpoint, timers."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from runs.models import AuthorityGrant, Effect, Run, Timer
from runs.selectors import (
    checkpoint_summary,
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
