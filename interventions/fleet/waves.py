"""A fleet operation's waves: each an outbox job (interventions/jobs.py) that issues the per-run
contract on its runs, one decision each, then schedules the next wave ``pause_s`` later or ends the
operation.

Consistency with a halt: every per-run decision locks the operation row first (``_Target.before``,
inside ``base.issue``'s transaction) and commits only while the operation is running and its target
pending; a halt takes the same lock. So after a halt commits, no further run is decided, and a
decision that committed first is counted. Lock order: operation, then run, then the audit head --
the halt takes operation then audit head, never a run.

Idempotent: a redelivered wave finds its decided targets no longer pending and skips them; a wave of
an operation no longer running does nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import Actor, system_actor
from core.auth import actor_for_user
from core.errors import Conflict, DomainError
from core.live import announce_fleet
from interventions import jobs
from interventions.base import issue
from interventions.fleet.operations import halt, operation_facts, wave_key, wave_timeout_s
from interventions.fleet.selection import RECORDED_KINDS
from interventions.models import FleetOperation, FleetTarget, Intervention, Job
from interventions.plugins import Request

log = logging.getLogger(__name__)


class OperationStopped(Conflict):
    code = "fleet_operation_stopped"


class TargetDecided(Conflict):
    code = "fleet_target_decided"


@dataclass
class _Target:
    """base.issue's parent: the operation row lock, then the target's link to its receipt."""

    operation_id: Any
    target_id: int

    def before(self) -> None:
        op = FleetOperation.objects.select_for_update().get(pk=self.operation_id)
        if op.state != FleetOperation.RUNNING:
            raise OperationStopped(
                f"fleet operation {op.pk} is {op.state}: no further run is decided",
                operation=str(op.pk),
            )
        if not FleetTarget.objects.filter(pk=self.target_id, status=FleetTarget.PENDING).exists():
            raise TargetDecided("this run was already decided by this operation")

    def after(self, intervention: Intervention) -> None:
        FleetTarget.objects.filter(pk=self.target_id).update(
            status=FleetTarget.SUCCEEDED, intervention=intervention, finished_at=timezone.now()
        )
        FleetOperation.objects.filter(pk=self.operation_id).update(succeeded=F("succeeded") + 1)
        announce_fleet(self.operation_id)


@shared_task(acks_late=True)
def run_fleet_wave(key: str) -> dict[str, Any]:
    return jobs.perform("fleet_wave", key, lambda: execute_wave(key))


def execute_wave(key: str) -> dict[str, Any]:
    op_id, _, number = key.rpartition(":")
    wave = int(number)
    op = FleetOperation.objects.select_related("created_by").get(pk=op_id)
    if op.state != FleetOperation.RUNNING or op.current_wave != wave:
        return {"skipped": f"operation {op.state}, wave {op.current_wave}"}
    actor = _actor(op)
    targets = (
        FleetTarget.objects.filter(operation=op, wave=wave, status=FleetTarget.PENDING)
        .select_related("run__decision_authority")
        .order_by("position")
    )
    outcomes: dict[str, int] = {}
    for target in list(targets):
        outcome = _decide(op, target, actor)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome == "stopped":
            break
    return {"wave": wave, **outcomes, **_close_wave(op.pk, wave)}


def _actor(op: FleetOperation) -> Actor:
    """The operator who started it, with the roles they hold now: a right withdrawn mid-operation
    refuses the remaining runs (and the budget halts it)."""
    if op.created_by is None or not op.created_by.is_active:
        return system_actor("fleet", name=f"{op.created_by_label} (no longer active)")
    return actor_for_user(op.created_by, component="fleet")


def _decide(op: FleetOperation, target: FleetTarget, actor: Actor) -> str:
    run = target.run
    owner = run.decision_authority
    owned_by_another = owner is not None and owner.pk != actor.user_id
    override = op.override_reason or (
        f"incident command: {op.reason}" if op.kind == "take_command" else ""
    )
    req = Request(
        kind=RECORDED_KINDS[op.kind],
        reason=op.reason,
        options={**op.options, "fleet_operation": str(op.pk)},
        override_reason=override if owned_by_another else "",
    )
    try:
        issue(actor=actor, run_id=run.pk, req=req, parent=_Target(op.pk, target.pk))
    except OperationStopped:
        return "stopped"
    except TargetDecided:
        return "already_decided"
    except DomainError as err:  # refused (and audited as a denial by base.issue)
        return _failed(op.pk, target.pk, err.code, err.detail, audited=True)
    except Exception as err:  # a dependency raising inside the decision: that run failed
        log.exception("fleet %s: run %s failed", op.pk, run.pk)
        return _failed(op.pk, target.pk, type(err).__name__, str(err), audited=False)
    return "succeeded"


def _failed(op_id: Any, target_id: int, code: str, detail: str, *, audited: bool) -> str:
    """Count a failed run; past the error budget, halt the operation (its own audited decision)."""
    fleet = system_actor("fleet")
    with transaction.atomic():
        op = FleetOperation.objects.select_for_update().get(pk=op_id)
        target = FleetTarget.objects.get(pk=target_id)
        if target.status != FleetTarget.PENDING:  # halted meanwhile: it stays skipped
            return "stopped" if op.state != FleetOperation.RUNNING else "already_decided"
        target.status, target.error, target.detail = FleetTarget.FAILED, code[:50], detail[:2000]
        target.finished_at = timezone.now()
        target.save(update_fields=["status", "error", "detail", "finished_at"])
        op.failed += 1
        op.save(update_fields=["failed"])
        announce_fleet(op.pk)
        if not audited:  # a refusal is audited by the decision; an exception is not, so here
            record_audit(
                actor=fleet,
                action="fleet.run_failed",
                object_type="run",
                object_id=target.run_id,
                run_id=target.run_id,
                outcome=AuditEvent.ERROR,
                reason=f"{code}: {detail}",
                context={"operation": str(op.pk), "kind": op.kind},
            )
        if op.state == FleetOperation.RUNNING and op.failed > op.max_failures:
            why = (
                f"error budget exceeded: {op.failed} of {op.total} runs failed (budget "
                f"{op.max_failures}); last: {code}: {detail}"
            )
            halt(op, fleet, why[:2000], automatic=True)
            return "stopped"
    return "failed"


def _close_wave(op_id: Any, wave: int) -> dict[str, Any]:
    """The wave is over: schedule the next one ``pause_s`` from now, or end the operation."""
    with transaction.atomic():
        op = FleetOperation.objects.select_for_update().get(pk=op_id)
        if op.state != FleetOperation.RUNNING or op.current_wave != wave:
            return {"next": None, "state": op.state}
        if FleetTarget.objects.filter(operation=op, wave=wave, status=FleetTarget.PENDING).exists():
            # A target this delivery did not reach: fail the delivery so the job runs the wave again.
            raise RuntimeError(f"wave {wave} of {op.pk} has undecided runs; delivering it again")
        following = (
            FleetTarget.objects.filter(operation=op, status=FleetTarget.PENDING)
            .order_by("wave")
            .values_list("wave", flat=True)
            .first()
        )
        now = timezone.now()
        announce_fleet(op.pk)
        if following is None:
            op.state, op.finished_at, op.next_wave_at = FleetOperation.COMPLETED, now, None
            op.save(update_fields=["state", "finished_at", "next_wave_at"])
            record_audit(
                actor=system_actor("fleet"),
                action="fleet.completed",
                object_type="fleet_operation",
                object_id=op.pk,
                reason=op.reason,
                context=operation_facts(op),
            )
            return {"next": None, "state": op.state}
        op.current_wave, op.next_wave_at = following, now + timedelta(seconds=op.pause_s)
        op.save(update_fields=["current_wave", "next_wave_at"])
        jobs.enqueue(
            "fleet_wave",
            wave_key(op.pk, following),
            None,
            countdown=op.pause_s,
            timeout_s=wave_timeout_s(op),
        )
        return {"next": following, "state": op.state, "in_s": op.pause_s}


def give_up_wave(job: Job) -> None:
    """A wave whose job keeps failing halts its operation (the runs it reached keep their receipts)."""
    op_id = job.target_id.rpartition(":")[0]
    op = FleetOperation.objects.select_for_update().filter(pk=op_id).first()
    if op is not None and op.state == FleetOperation.RUNNING:
        why = f"the wave job failed {job.failures} time(s); last error: {job.last_error}"
        halt(op, system_actor("fleet"), why[:2000], automatic=True)


jobs.register_kind("fleet_wave", run_fleet_wave, give_up_wave)
