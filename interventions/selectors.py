"""Reads of interventions for the edges (API and console alike): one shape per fact."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from django.db.models import Count, Prefetch, QuerySet

from audit.models import AuditEvent
from core.actors import Actor
from interventions.facts import in_flight_effects
from interventions.models import (
    CascadeTarget,
    CompensationPlan,
    CompensationStep,
    FleetOperation,
    Intervention,
    Job,
)
from runs.models import ExecutionLease, HistoryEvent, Run
from runs.selectors import descendants, drain_after
from runs.team_scope import scoped


class CascadeProgress(TypedDict):
    """Where a tree cascade (interventions/cascade.py) stands, counted from its rows."""

    children: int  # listed in the cascade
    reached: int  # decided so far: changed, or found not to apply
    changed: int
    unchanged: int
    status: str  # "running" | "done"
    job: str | None


def progress(intervention: Intervention, job_id: Any = None) -> CascadeProgress:
    counts = dict(
        CascadeTarget.objects.filter(intervention=intervention)
        .values_list("status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    total = sum(counts.values())
    pending = counts.get(CascadeTarget.PENDING, 0)
    if job_id is None:
        job_id = ((intervention.receipt or {}).get("cascade") or {}).get("job")
    return {
        "children": total,
        "reached": total - pending,
        "changed": counts.get(CascadeTarget.CHANGED, 0),
        "unchanged": counts.get(CascadeTarget.UNCHANGED, 0),
        "status": "running" if pending else "done",
        "job": str(job_id) if job_id else None,
    }


def progress_text(p: Any) -> str:
    """ "120 of 200 children reached (the rest in the background)"."""
    n, m = p.get("reached", 0), p.get("children", 0)
    tail = " (the rest in the background)" if p.get("status") == "running" else ""
    return f"{n} of {m} {'child' if m == 1 else 'children'} reached{tail}"


def live_receipt(i: Intervention) -> dict[str, Any]:
    """The stored receipt, with a cascade still running counted as it stands now."""
    receipt = i.receipt or {}
    running = (receipt.get("cascade") or {}).get("status") == "running"
    return {**receipt, "cascade": progress(i)} if running else receipt


def running_cascades(run: Any) -> list[dict[str, Any]]:
    """The tree pauses and cancels of this run still reaching its children, with their progress."""
    pending = Intervention.objects.filter(
        run_id=run.pk, status=Intervention.PENDING, scope="tree", kind__in=("pause", "cancel")
    ).order_by("created_at")
    return [
        {"id": str(i.pk), "kind": i.kind, "text": progress_text(progress(i))}
        for i in pending
        if (i.receipt or {}).get("cascade")
    ]


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
        "receipt": live_receipt(i),
        "created_at": i.created_at.isoformat(),
        "completed_at": i.completed_at.isoformat() if i.completed_at else None,
    }


def intervention_by_id(intervention_id: Any) -> Intervention | None:
    return Intervention.objects.filter(pk=intervention_id).first()


def operation_by_id(operation_id: Any, actor: Actor | None = None) -> FleetOperation | None:
    """The operation; None also for another team's (``actor``'s teams: runs.team_scope)."""
    qs = FleetOperation.objects.filter(pk=operation_id)
    return (scoped(qs, actor) if actor is not None else qs).first()


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
        "cascade": live_receipt(i).get("cascade"),
    }
    now["final"] = i.status != Intervention.PENDING and run.state not in MOVING
    return now


def operation_exists(operation_id: Any, actor: Actor | None = None) -> bool:
    qs = FleetOperation.objects.filter(pk=operation_id)
    return (scoped(qs, actor) if actor is not None else qs).exists()


def compensation_plans(*, intervention: Any = None, run: Any = None) -> list[CompensationPlan]:
    """Compensation plans, newest first, each with its steps (in order) and their effects: those
    one intervention wrote, or all of one run's."""
    steps = CompensationStep.objects.select_related("effect").order_by("position")
    qs = CompensationPlan.objects.prefetch_related(Prefetch("steps", queryset=steps))
    if intervention is not None:
        qs = qs.filter(intervention=intervention)
    if run is not None:
        qs = qs.filter(run=run)
    return list(qs.order_by("-created_at"))


# The run page's timeline (console/timeline.py) reads five tables, each newest first, one page of
# ``n`` rows at most inside an optional (before, after) window of its own time column.


def _window(qs: QuerySet, field_name: str, before: datetime | None, after: datetime | None):
    if before is not None:
        qs = qs.filter(**{f"{field_name}__lt": before})
    if after is not None:
        qs = qs.filter(**{f"{field_name}__gt": after})
    return qs


def history_page(
    run: Run, kinds: list[str] | None, before: datetime | None, after: datetime | None, n: int
) -> list[HistoryEvent]:
    """The run's history, newest first; ``kinds`` None means every kind."""
    qs = HistoryEvent.objects.filter(run=run)
    if kinds is not None:
        qs = qs.filter(kind__in=kinds)
    return list(_window(qs, "created_at", before, after).order_by("-seq")[:n])


def interventions_page(
    run: Run, before: datetime | None, after: datetime | None, n: int
) -> list[Intervention]:
    qs = Intervention.objects.filter(run=run)
    return list(_window(qs, "created_at", before, after).order_by("-created_at")[:n])


def interventions_by_ids(run: Run, ids: list[Any]) -> list[Intervention]:
    """These interventions of the run (a live push re-reads the timeline lines it re-sends)."""
    return list(Intervention.objects.filter(run=run, pk__in=ids))


def ended_leases_page(
    run: Run, before: datetime | None, after: datetime | None, n: int
) -> list[ExecutionLease]:
    qs = ExecutionLease.objects.filter(run=run, ended_at__isnull=False)
    return list(_window(qs, "ended_at", before, after).order_by("-ended_at")[:n])


def jobs_page(
    run: Run, before: datetime | None, after: datetime | None, n: int
) -> tuple[list[Job], list[Job]]:
    """The run's jobs as queued (by created_at) and as ended (by finished_at), newest first."""
    queued = _window(Job.objects.filter(run=run), "created_at", before, after)
    ended = _window(
        Job.objects.filter(run=run, finished_at__isnull=False), "finished_at", before, after
    )
    return list(queued.order_by("-created_at")[:n]), list(ended.order_by("-finished_at")[:n])


def denials_page(
    run: Run, before: datetime | None, after: datetime | None, n: int
) -> list[AuditEvent]:
    """Refused decisions audited about the run (after their rollback, so not in its history)."""
    qs = AuditEvent.objects.filter(run_id=run.pk, outcome=AuditEvent.DENIED)
    return list(_window(qs, "created_at", before, after).order_by("-seq")[:n])


def latest_intervention(run: Any, kind: str) -> Intervention | None:
    """The newest ``kind`` intervention on the run, else on its nearest ancestor (a tree cascade)."""
    current: Any = run
    while current is not None:
        found = Intervention.objects.filter(run_id=current.pk, kind=kind).order_by("-created_at")
        if (first := found.first()) is not None:
            return first
        current = Run.objects.filter(pk=current.parent_id).first() if current.parent_id else None
    return None


# -- long lists a preview or receipt shows the start of (interventions/paging.py) -----------------


def _tree_row(position: int, run: Run) -> dict[str, Any]:
    return {
        "position": position,
        "id": str(run.pk),
        "agent": run.agent.name,
        "parent": str(run.parent_id),
        "state": run.state,
    }


def tree_page(run: Run, after: int, limit: int) -> tuple[list[dict[str, Any]], int]:
    """``limit`` of the run's descendants from position ``after``, breadth first, and how many."""
    tree = descendants(run)
    return [_tree_row(after + i, r) for i, r in enumerate(tree[after : after + limit])], len(tree)


def target_row(t: CascadeTarget) -> dict[str, Any]:
    return {
        "position": t.position,
        "id": str(t.run_id),
        "agent": t.run.agent.name,
        "parent": str(t.run.parent_id),
        "in_scope": True,
        "state_before": t.state_before,
        "status": t.status,
        "state": t.state_after or t.state_before,
        "note": t.note,
        "reached_at": t.reached_at.isoformat() if t.reached_at else None,
    }


def cascade_page(i: Intervention, after: int, limit: int) -> dict[str, Any]:
    """The children a pause or cancel listed, with what it did to each, from ``after``. A scope-run
    intervention listed them without reaching them: its page is the run's children as they are now."""
    targets = CascadeTarget.objects.filter(intervention=i)
    if i.scope != "tree":
        run = Run.objects.get(pk=i.run_id)
        rows, total = tree_page(run, after, limit)
        children = [r | {"in_scope": False, "status": "not in scope", "note": ""} for r in rows]
        return {
            "intervention": str(i.pk),
            "scope": i.scope,
            "cascade": None,
            "total": total,
            "children": children,
        }
    page = targets.select_related("run__agent").filter(position__gte=after).order_by("position")
    return {
        "intervention": str(i.pk),
        "scope": i.scope,
        "cascade": progress(i),
        "total": targets.count(),
        "children": [target_row(t) for t in page[:limit]],
    }
