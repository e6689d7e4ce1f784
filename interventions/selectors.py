"""Reads of interventions for the edges (API and console alike): one shape per fact."""

from __future__ import annotations

from typing import Any

from interventions.models import FleetOperation, Intervention


def receipt_dict(i: Intervention) -> dict[str, Any]:
    return {
        "id": str(i.pk),
        "run_id": str(i.run_id),
        "kind": i.kind,
        "status": i.status,
        "actor": i.actor_label,
        "role": i.role,
        "reason": i.reason,
        "scope": i.scope,
        "options": i.options,
        "override": i.override,
        "override_reason": i.override_reason,
        "preview": i.preview,
        "receipt": i.receipt,
        "created_at": i.created_at.isoformat(),
        "completed_at": i.completed_at.isoformat() if i.completed_at else None,
    }


def intervention_by_id(intervention_id: Any) -> Intervention | None:
    return Intervention.objects.filter(pk=intervention_id).first()


def operation_by_id(operation_id: Any) -> FleetOperation | None:
    return FleetOperation.objects.filter(pk=operation_id).first()


def recent_interventions(run: Any, limit: int) -> list[Intervention]:
    """A run's newest interventions, with who asked."""
    return list(run.interventions.select_related("actor").order_by("-created_at")[:limit])


def latest_intervention(run: Any, kind: str) -> Intervention | None:
    """The newest ``kind`` intervention on the run, else on its nearest ancestor (a tree cascade)."""
    from runs.models import Run

    current: Any = run
    while current is not None:
        found = Intervention.objects.filter(run_id=current.pk, kind=kind).order_by("-created_at")
        if (first := found.first()) is not None:
            return first
        current = Run.objects.filter(pk=current.parent_id).first() if current.parent_id else None
    return None
