"""Follow-up jobs through a transactional outbox: nothing is lost when Redis or a worker is.

A decision that needs a follow-up job (revalidation, reconcile, compensation, recovery) calls
:func:`enqueue` inside its own transaction: the :class:`~interventions.models.Job` row commits with
the decision or not at all. Celery is only the delivery: the message is sent after commit, and a
failed send (Redis down) is logged, never raised -- the decision is committed and its receipt is
answered. The beat task :func:`sweep_jobs` delivers again every job not finished by its ``due_at``
(a lost message, a flushed Redis, a killed worker). It is the only re-delivery: compensation plans
and recoveries are jobs like any other and have no sweep of their own (a compensation step a dead
worker had claimed is taken over by the next delivery once its claim expires), and their attempts are
the job's. Runs orphaned without a recovery are found where lease expiry is scanned
(``recover.scan_expired_leases``).

Tasks wrap their work in :func:`perform`: a delivery of a job already ``done`` (or given up) does
nothing, the job is marked done exactly once, and a delivery that raises (or, seen by the sweep, never
reports back) counts a failure. After ``JOB_MAX_ATTEMPTS`` failures the job is ``failed``: the kind's
``give_up`` hook concludes what the job was for (the intervention or plan ends failed, with the
error) and a run waiting in the job's transient state moves to ``needs_attention``, where an
operator can pause, cancel, close, resume, retry, recover or compensate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import record_audit
from core.actors import system_actor
from core.live import announce
from interventions.base import finish_job
from interventions.models import Intervention, Job
from runs.models import Run
from runs.services.decisions import apply_transition, lock_run, notify_run_changed
from runs.services.history import append_history
from runs.states import Event, transition

log = logging.getLogger(__name__)

# Sending a message must not hold a request for long: one quick retry, then the sweep's turn.
PUBLISH_RETRY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
SWEEP_BATCH = 200


@dataclass(frozen=True)
class JobKind:
    name: str
    task: Any  # a Celery task called with (target_id,)
    give_up: Callable[
        [Job], None
    ]  # in the give-up transaction: conclude the target, with the error


KINDS: dict[str, JobKind] = {}


def register_kind(name: str, task: Any, give_up: Callable[[Job], None]) -> None:
    KINDS[name] = JobKind(name, task, give_up)


def max_attempts() -> int:
    return max(int(getattr(settings, "JOB_MAX_ATTEMPTS", 5)), 1)


def default_timeout_s() -> int:
    return max(int(getattr(settings, "JOB_TIMEOUT_S", 120)), 1)


def backoff_s(failures: int, *, base: float | None = None, cap: float = 300.0) -> float:
    """The doubling wait before a job's next try; a kind with its own pace (notifications) passes
    ``base`` and ``cap``."""
    if base is None:
        base = float(getattr(settings, "JOB_RETRY_BACKOFF_S", 2))
    return min(base * 2 ** max(failures - 1, 0), cap)


# -- writing and delivering -----------------------------------------------------------------------


def enqueue(
    kind: str,
    target_id: Any,
    run: Run | Any,
    *,
    timeout_s: int | None = None,
    countdown: float = 0,
) -> Job:
    """Inside the decision's transaction: record the job; hand it to Celery once that commits.
    ``countdown``: not before that many seconds (a fleet operation's pause between waves); the sweep
    counts its due time from then."""
    now, timeout = timezone.now(), timeout_s or default_timeout_s()
    job = Job.objects.create(
        kind=kind,
        target_id=str(target_id),
        run_id=getattr(run, "pk", run),
        timeout_s=timeout,
        enqueued_at=now,
        due_at=now + timedelta(seconds=countdown + timeout),
    )
    target = str(target_id)
    transaction.on_commit(lambda: deliver(kind, target, countdown=countdown or None))
    if job.run_id is not None:  # a fleet wave is about no single run: nothing to announce
        announce(job.run_id, "job", job.pk)
    return job


def deliver(kind: str, target_id: str, countdown: float | None = None) -> bool:
    """Send one message. Never raises: the row in PostgreSQL is the job; the sweep sends it again."""
    try:
        KINDS[kind].task.apply_async(
            (target_id,), countdown=countdown, retry=True, retry_policy=PUBLISH_RETRY
        )
        return True
    except Exception as exc:  # the broker is down or refused: the decision stands, the row waits
        log.warning(
            "could not hand the %s job %s to the broker (%s); the job sweep will deliver it",
            kind,
            target_id,
            exc,
        )
        return False


# -- running (called by the tasks) -----------------------------------------------------------------


def perform(
    kind: str,
    target_id: Any,
    work: Callable[[], dict[str, Any]],
    *,
    finished: Callable[[dict[str, Any]], bool] = lambda result: True,
    come_back_in: Callable[[dict[str, Any]], float] = lambda result: 0.0,
) -> dict[str, Any]:
    """Run one delivery of a job. ``finished(result)`` says whether the work is over (a compensation
    plan waiting for a backoff is not); ``come_back_in(result)`` how long until its own next delivery."""
    job = _begin(kind, str(target_id))
    if job is None:  # no outbox row (a direct call or a message from before the outbox)
        return work()
    if not isinstance(job, Job):
        return {"skipped": "already concluded"}  # done, or given up
    try:
        result = work()
    except (
        Exception
    ) as exc:  # the job's own bug or a dependency down: counted, retried, then given up
        log.exception("%s job %s failed (delivery %s)", kind, target_id, job.attempts)
        _failed_attempt(job.pk, f"{type(exc).__name__}: {exc}")
        return {"failed": f"{type(exc).__name__}: {exc}"}
    if finished(result):
        if mark_done(job.pk):
            announce(job.run_id, "job", job.pk)  # not in a transaction: sent now
    else:
        wait = come_back_in(result) + job.timeout_s
        Job.objects.filter(pk=job.pk, status__in=Job.OPEN).update(
            due_at=timezone.now() + timedelta(seconds=wait)
        )
    return result


def still_working(kind: str, target_id: Any) -> None:
    """A long delivery's heartbeat (a cascade through thousands of runs): its job is due again one
    timeout from now, so the sweep does not take a delivery that is progressing for a lost one."""
    now = timezone.now()
    for job in Job.objects.filter(kind=kind, target_id=str(target_id), status=Job.RUNNING):
        Job.objects.filter(pk=job.pk, status=Job.RUNNING).update(
            due_at=now + timedelta(seconds=job.timeout_s)
        )


def _begin(kind: str, target_id: str) -> Job | None | bool:
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(kind=kind, target_id=target_id).first()
        if job is None:
            return None
        if job.status not in Job.OPEN:
            return False
        now = timezone.now()
        job.status, job.attempts, job.started_at = Job.RUNNING, job.attempts + 1, now
        job.due_at = now + timedelta(seconds=job.timeout_s)
        job.save(update_fields=["status", "attempts", "started_at", "due_at"])
        return job


def mark_done(job_id: Any) -> bool:
    """Exactly once: only an open job becomes done; a later delivery finds it done and does nothing."""
    now = timezone.now()
    return bool(
        Job.objects.filter(pk=job_id, status__in=Job.OPEN).update(
            status=Job.DONE, finished_at=now, due_at=now
        )
    )


def _failed_attempt(job_id: Any, error: str) -> None:
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.status not in Job.OPEN:
            return
        job.failures, job.last_error = job.failures + 1, error[:2000]
        if job.failures >= max_attempts():
            give_up(job)
            return
        wait = backoff_s(job.failures)
        now = timezone.now()
        job.status, job.enqueued_at = Job.PENDING, now
        job.due_at = now + timedelta(seconds=wait + job.timeout_s)
        job.save(update_fields=["failures", "last_error", "status", "enqueued_at", "due_at"])
        kind, target = job.kind, job.target_id
        transaction.on_commit(lambda: deliver(kind, target, countdown=wait))


def give_up(job: Job) -> None:
    """Inside the caller's transaction, job row locked: end the job ``failed`` and hand the run to an
    operator. The kind's hook locks its target before the run (the order its own job uses)."""
    actor = system_actor("jobs")
    KINDS[job.kind].give_up(job)
    if job.run_id is None:  # about no single run (a fleet wave): the kind's hook concluded it
        job.status, job.finished_at = Job.FAILED, timezone.now()
        job.save(update_fields=["failures", "last_error", "status", "finished_at"])
        return
    run = lock_run(job.run_id)
    why = f"{job.kind} job failed {job.failures} time(s); last error: {job.last_error}"
    facts = {
        "job": str(job.pk),
        "kind": job.kind,
        "target": job.target_id,
        "attempts": job.attempts,
        "failures": job.failures,
        "last_error": job.last_error,
    }
    if transition(run.state, Event.JOB_FAILED) is not None:
        apply_transition(run, Event.JOB_FAILED, actor=actor, reason=why, data=facts)
    else:  # the run is not waiting on this job (a reconcile): it keeps its state; the page says why
        append_history(run, "job_failed", facts, actor=actor)
        notify_run_changed(run)
    record_audit(
        actor=actor,
        action="job.failed",
        object_type="job",
        object_id=job.pk,
        run_id=run.pk,
        outcome=AuditEvent.ERROR,
        reason=why,
        context={**facts, "run_state": run.state},
    )
    job.status, job.finished_at = Job.FAILED, timezone.now()
    job.save(update_fields=["failures", "last_error", "status", "finished_at"])
    announce(job.run_id, "job", job.pk)


def give_up_intervention(job: Job) -> None:
    """For jobs that conclude an intervention: it ends failed, and its receipt says why."""
    intervention = Intervention.objects.select_for_update().filter(pk=job.target_id).first()
    if intervention is not None and intervention.status == Intervention.PENDING:
        finish_job(
            intervention,
            Intervention.FAILED,
            {
                "kind": job.kind,
                "outcome": "gave_up",
                "attempts": job.attempts,
                "failures": job.failures,
                "error": job.last_error,
            },
        )


# -- the sweep ---------------------------------------------------------------------------------------


@shared_task(acks_late=True)
def sweep_jobs() -> dict[str, list[str]]:
    """Periodic: deliver again every job not finished by its due time. A job whose delivery had
    started and never reported back (worker killed, message lost mid-job) counts a failure; one that
    never started (message lost, broker down at commit) does not -- a broker outage is not the job's
    fault. Deliveries are idempotent, so a false alarm costs one no-op."""
    now = timezone.now()
    out: dict[str, list[str]] = {"delivered": [], "failed": []}
    due = Job.objects.filter(status__in=Job.OPEN, due_at__lte=now).order_by("due_at")
    for job_id in list(due.values_list("pk", flat=True)[:SWEEP_BATCH]):
        decided = _sweep_one(job_id, now)
        if decided is None:
            continue
        verdict, kind, target = decided
        if verdict == "deliver":
            deliver(kind, target)
        out["delivered" if verdict == "deliver" else "failed"].append(str(job_id))
    return out


def _sweep_one(job_id: Any, now) -> tuple[str, str, str] | None:
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(skip_locked=True)
            .filter(pk=job_id, status__in=Job.OPEN, due_at__lte=now)
            .first()
        )
        if job is None:  # finished meanwhile, or a delivery holds the row right now
            return None
        if job.status == Job.RUNNING:
            job.failures += 1
            job.last_error = f"no result within {job.timeout_s}s (worker lost or message lost)"
            if job.failures >= max_attempts():
                give_up(job)
                return "failed", job.kind, job.target_id
        job.status, job.enqueued_at = Job.PENDING, now
        job.due_at = now + timedelta(seconds=job.timeout_s)
        job.save(update_fields=["failures", "last_error", "status", "enqueued_at", "due_at"])
        return "deliver", job.kind, job.target_id


# -- reads for the edges -------------------------------------------------------------------------


def attention(run: Run) -> list[dict[str, Any]]:
    """Failed jobs the operator has not moved past: those that failed since the run's last change
    of state (a give-up that moved the run to needs_attention records its end after the move)."""
    jobs = Job.objects.filter(
        run=run, status=Job.FAILED, finished_at__gte=run.state_changed_at
    ).order_by("-finished_at")
    return [
        {
            "id": str(j.pk),
            "kind": j.kind,
            "target": j.target_id,
            "attempts": j.attempts,
            "failures": j.failures,
            "last_error": j.last_error,
            "finished_at": j.finished_at.isoformat() if j.finished_at else None,
        }
        for j in jobs[:3]
    ]
