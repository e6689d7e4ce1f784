"""A tree-scoped pause or cancel reaches the run's descendants child by child, not in one request.

In the decision's transaction the intervention's run moves, the tree is listed as it stands (one
:class:`~interventions.models.CascadeTarget` row per descendant, breadth first) and the first
``CASCADE_INLINE_CHILDREN`` are reached there and then. If more remain, the intervention is
``pending`` and a ``cascade`` job (the outbox, interventions/jobs.py) is written in the same
transaction; the job reaches the rest, **each child in its own transaction** (row lock, the state
table, history and audit, as any decision), and ends the intervention ``completed``. A 1,500-child
tree cancelled in one request took 27.8 s; now the request does a bounded amount of work.

Why it is safe to stop anywhere: a target is marked in the transaction that moves its child, so a
job killed halfway leaves every child either reached (and marked) or untouched (and pending); the
sweep delivers the job again and it resumes at the first pending row. A child created after the
listing (by a descendant still running when it was listed) is added to the list before the job ends.
Progress ("n of m children reached") is read from the rows: interventions.selectors.progress.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor, system_actor
from core.auth import actor_for_user
from core.live import announce
from interventions import jobs
from interventions.base import descendants
from interventions.models import CascadeTarget, Intervention
from interventions.plugins import Request
from interventions.selectors import CascadeProgress, progress
from runs.models import Run
from runs.services.decisions import lock_run

# kind -> reach one locked child: None when the contract moved it, else why it did not apply.
Step = Callable[[Run, Request, Actor, dict[str, Any]], str | None]
STEPS: dict[str, Step] = {}


def register_step(kind: str, step: Step) -> None:
    STEPS[kind] = step


def inline_limit() -> int:
    return max(int(getattr(settings, "CASCADE_INLINE_CHILDREN", 20)), 0)


def list_tree(intervention: Intervention, run: Run) -> int:
    """Inside the decision: one pending row per descendant not yet listed. Returns how many it added."""
    known = set(intervention.cascade_targets.values_list("run_id", flat=True))
    start = intervention.cascade_targets.count()
    rows = [
        CascadeTarget(
            intervention=intervention, run=child, position=start + i, state_before=child.state
        )
        for i, child in enumerate(c for c in descendants(run) if c.pk not in known)
    ]
    CascadeTarget.objects.bulk_create(rows, batch_size=500)
    return len(rows)


def start(run: Run, req: Request, actor: Actor, intervention: Intervention) -> CascadeProgress:
    """In the decision's transaction, after ``run`` itself moved: list the tree, reach the first
    children here, hand the rest to the cascade job."""
    list_tree(intervention, run)
    via = {"cascade_of": str(intervention.pk)}
    first = intervention.cascade_targets.order_by("position").values_list("pk", flat=True)
    for target_id in list(first[: inline_limit()]):
        reach(target_id, req, actor, via)
    # A grandchild its parent created after the listing, before the parent was reached, is listed
    # now (a reached parent can no longer delegate: runs.states.DELEGATING_STATES).
    list_tree(intervention, run)
    job = None
    if intervention.cascade_targets.filter(status=CascadeTarget.PENDING).exists():
        Intervention.objects.filter(pk=intervention.pk).update(status=Intervention.PENDING)
        intervention.status = Intervention.PENDING
        job = jobs.enqueue("cascade", intervention.pk, run)
    return progress(intervention, job_id=job.pk if job else None)


def reach(target_id: Any, req: Request, actor: Actor, via: dict[str, Any]) -> bool:
    """One child, in its own transaction (a savepoint inside the decision's): lock the target row,
    then the child's run; apply the contract's step unless an earlier delivery already did."""
    with transaction.atomic():
        target = CascadeTarget.objects.select_for_update().get(pk=target_id)
        if target.status != CascadeTarget.PENDING:
            return False
        child = lock_run(target.run_id)
        note = STEPS[req.kind](child, req, actor, via)
        target.status = CascadeTarget.CHANGED if note is None else CascadeTarget.UNCHANGED
        target.state_after, target.note, target.reached_at = child.state, note or "", timezone.now()
        target.save(update_fields=["status", "state_after", "note", "reached_at"])
        return True


# -- the job -------------------------------------------------------------------------------------


@shared_task(acks_late=True)
def run_cascade(intervention_id: str) -> dict[str, Any]:
    # Not finished while a target is pending (a pass limit reached): the sweep delivers it again.
    return jobs.perform(
        "cascade",
        intervention_id,
        lambda: cascade(intervention_id),
        finished=lambda result: result.get("status") != "running",
    )


def _actor(intervention: Intervention) -> Actor:
    """The operator who issued it: the cascade carries out their decision."""
    user = intervention.actor
    if user is None or not user.is_active:
        return system_actor("cascade", name=f"{intervention.actor_label} (cascade)")
    return actor_for_user(user, component="cascade")


def cascade(intervention_id: Any, *, passes: int = 4) -> dict[str, Any]:
    """Reach every pending target in order; then list children created since, and go on until none
    is new (bounded: a tree is at most MAX_TREE_DEPTH levels). Ends the intervention completed."""
    intervention = Intervention.objects.select_related("actor", "run").get(pk=intervention_id)
    if intervention.status != Intervention.PENDING:
        return {"skipped": f"intervention {intervention.status}"}
    req = Request(
        kind=intervention.kind,
        reason=intervention.reason,
        scope=intervention.scope,
        options=intervention.options or {},
        override_reason=intervention.override_reason,
    )
    actor, via = _actor(intervention), {"cascade_of": str(intervention.pk)}
    reached = 0
    for _ in range(max(passes, 1)):
        pending = intervention.cascade_targets.filter(status=CascadeTarget.PENDING)
        for target_id in list(pending.order_by("position").values_list("pk", flat=True)):
            if reach(target_id, req, actor, via):
                reached += 1
                if reached % 25 == 0:  # the run page's progress line, not one push per child
                    announce(intervention.run_id, "intervention", intervention.pk)
        # Children created before their parent was reached (a reached parent can no longer
        # delegate: runs.states.DELEGATING_STATES) are committed by now: list them, go on.
        if not list_tree(intervention, intervention.run):
            break
    return finish(intervention.pk, actor) | {"reached_now": reached}


def finish(intervention_id: Any, actor: Actor) -> dict[str, Any]:
    with transaction.atomic():
        intervention = Intervention.objects.select_for_update().get(pk=intervention_id)
        done = progress(intervention)
        if intervention.status != Intervention.PENDING or done["status"] != "done":
            return dict(done)
        intervention.receipt = {**intervention.receipt, "cascade": done}
        intervention.status, intervention.completed_at = Intervention.COMPLETED, timezone.now()
        intervention.save(update_fields=["receipt", "status", "completed_at"])
        record_audit(
            actor=actor,
            action=f"intervention.{intervention.kind}.cascaded",
            object_type="intervention",
            object_id=intervention.pk,
            run_id=intervention.run_id,
            reason=intervention.reason,
            context={"intervention": str(intervention.pk), **done},
        )
        announce(intervention.run_id, "intervention", intervention.pk)
        return dict(done)


jobs.register_kind("cascade", run_cascade, jobs.give_up_intervention)
