"""Reads of interventions for the edges (API and console alike): one shape per fact."""

from __future__ import annotations

from typing import Any

from interventions.facts import in_flight_effects
from interventions.models import FleetOperation, Intervention
from runs.models import Run
from runs.selectors import drain_after


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


# Run states a receipt's headline still expects to change by itself (a worker, or a job, moves on).
MOVING = ("pausing", "cancelling", "revalidating", "recovering", "compensating")


def receipt_now(i: Intervention) -> dict[str, Any]:
    """What a receipt's headline reads at render time: the run as it is now, the drain recorded since
    the intervention, what is still in flight while it drains, and its follow-up job's status."""
    run = Run.objects.get(pk=i.run_id)
    now: dict[str, Any] = {
        "state": run.state,
        "since": run.state_changed_at.isoformat(),
        "status": i.status,
        "job": (i.receipt or {}).get("job") or {},
        "drained": drain_after(run, i.created_at),
        "in_flight": in_flight_effects(run) if run.state in ("pausing", "cancelling") else [],
    }
    now["final"] = i.status != Intervention.PENDING and run.state not in MOVING
    return now
