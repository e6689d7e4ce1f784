"""Compensation plan models (owned by the compensate contract, interventions/compensate.py).

A CompensationPlan is built from the ledger when a compensate (or a recovery choosing compensate)
commits: its steps are the committed action effects to undo, in reverse order. The plan row is the
lock the executor takes, so two deliveries of the Celery job never run a step at the same time; each
step's compensation is itself a ledger Effect (kind="compensation") with its own idempotency key.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

__all__ = ["CompensationPlan", "CompensationStep"]


class CompensationPlan(models.Model):
    PENDING, RUNNING = "pending", "running"
    COMPLETED, PARTIALLY_FAILED, FAILED = "completed", "partially_failed", "failed"
    STATUSES = [PENDING, RUNNING, COMPLETED, PARTIALLY_FAILED, FAILED]
    LIVE = (PENDING, RUNNING)
    FINAL = (COMPLETED, PARTIALLY_FAILED, FAILED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="compensation_plans")
    # The compensate intervention, or the recover intervention that chose to compensate.
    intervention = models.ForeignKey(
        "interventions.Intervention", on_delete=models.PROTECT, related_name="compensation_plans"
    )
    status = models.CharField(max_length=20, default=PENDING)
    options = models.JSONField(default=dict, blank=True)  # max_attempts, backoff_s, claim_ttl_s
    # Called out, never executed: irreversible effects and effects without a usable compensation.
    called_out = models.JSONField(default=list, blank=True)
    skipped = models.JSONField(default=list, blank=True)  # already compensated
    result = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(
                    status__in=["pending", "running", "completed", "partially_failed", "failed"]
                ),
                name="compensation_plan_status_valid",
            ),
            # One live plan per run: two plans undoing the same effects at once is never right.
            models.UniqueConstraint(
                fields=["run"],
                condition=models.Q(status__in=["pending", "running"]),
                name="one_live_compensation_plan_per_run",
            ),
        ]

    def __str__(self) -> str:
        return f"plan {str(self.id)[:8]} for run {str(self.run_id)[:8]} ({self.status})"


class CompensationStep(models.Model):
    PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
    STATUSES = [PENDING, RUNNING, DONE, FAILED]
    OPEN = (PENDING, RUNNING)

    plan = models.ForeignKey(CompensationPlan, on_delete=models.PROTECT, related_name="steps")
    position = models.PositiveIntegerField()  # execution order: 1 runs first
    effect = models.ForeignKey(
        "runs.Effect", on_delete=models.PROTECT, related_name="compensation_steps"
    )
    # The compensation's own ledger effect, declared when the step first runs and reused by every
    # retry (same idempotency key, so the external system applies it at most once).
    compensation_effect = models.ForeignKey(
        "runs.Effect", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    tool = models.CharField(max_length=100)  # of the compensation (from the declared spec)
    action = models.CharField(max_length=100)
    args = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(
        max_length=200
    )  # the compensation's own key, fixed at plan time
    status = models.CharField(max_length=10, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)  # compensator calls started
    failures = models.PositiveIntegerField(
        default=0
    )  # failures recorded (retries are bounded by these)
    last_error = models.JSONField(null=True, blank=True)
    errors = models.JSONField(default=list, blank=True)  # every recorded failure, in order
    next_attempt_at = models.DateTimeField(null=True, blank=True)  # backoff
    # Who is calling the compensator right now, until when. A second delivery of the job backs off
    # while the claim is live; a redelivery of the same message (same task id) or an expired claim
    # (the worker died) takes the step over and calls again with the same key.
    claimed_by = models.CharField(max_length=200, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    external_ref = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["plan", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["plan", "position"], name="compensation_step_position_unique"
            ),
            models.UniqueConstraint(
                fields=["plan", "effect"], name="compensation_step_effect_unique"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "running", "done", "failed"]),
                name="compensation_step_status_valid",
            ),
        ]
