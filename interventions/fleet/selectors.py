"""Reads of fleet operations for the edges (API and console): progress by wave, per-run receipts."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, QuerySet

from core.actors import Actor
from interventions.models import FleetOperation, FleetTarget
from runs.team_scope import scoped

STATUSES = (FleetTarget.SUCCEEDED, FleetTarget.FAILED, FleetTarget.SKIPPED, FleetTarget.PENDING)


def recent_operations(limit: int = 50, actor: Actor | None = None) -> QuerySet[FleetOperation]:
    """The newest operations (of ``actor``'s teams, when given: runs.team_scope)."""
    qs = FleetOperation.objects.order_by("-created_at")
    return (scoped(qs, actor) if actor is not None else qs)[:limit]


def wave_progress(op: FleetOperation) -> list[dict[str, Any]]:
    """One row per wave: how many of its runs succeeded, failed, were skipped, are pending."""
    rows = (
        FleetTarget.objects.filter(operation=op)
        .values("wave")
        .annotate(
            total=Count("id"),
            **{s: Count("id", filter=Q(status=s)) for s in STATUSES},
        )
        .order_by("wave")
    )
    return [dict(r) for r in rows]


def target_dict(t: FleetTarget) -> dict[str, Any]:
    return {
        "run_id": str(t.run_id),
        "position": t.position,
        "wave": t.wave,
        "status": t.status,
        "intervention_id": str(t.intervention_id) if t.intervention_id else None,
        "error": t.error,
        "detail": t.detail,
        "finished_at": t.finished_at.isoformat() if t.finished_at else None,
    }


def operation_dict(op: FleetOperation, *, targets: bool = True) -> dict[str, Any]:
    op.refresh_from_db()
    out = {
        "id": str(op.pk),
        "kind": op.kind,
        "state": op.state,
        "filter": op.run_filter,
        "reason": op.reason,
        "options": op.options,
        "total": op.total,
        "excluded": op.excluded,
        "succeeded": op.succeeded,
        "failed": op.failed,
        "skipped": op.skipped,
        "pending": op.total - op.done,
        "max_failures": op.max_failures,
        "max_failure_pct": op.max_failure_pct,
        "waves": op.waves,
        "current_wave": op.current_wave,
        "wave_size": op.wave_size,
        "pause_s": op.pause_s,
        "next_wave_at": op.next_wave_at.isoformat() if op.next_wave_at else None,
        "halted_reason": op.halted_reason,
        "halted_by": op.halted_by,
        "halted_automatically": op.halted_automatically,
        "created_by": op.created_by_label,
        "created_at": op.created_at.isoformat(),
        "started_at": op.started_at.isoformat() if op.started_at else None,
        "finished_at": op.finished_at.isoformat() if op.finished_at else None,
        "wave_progress": wave_progress(op) if targets else [],
    }
    if targets:
        out["targets"] = [target_dict(t) for t in op.targets.order_by("position")]
    return out
