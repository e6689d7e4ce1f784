"""The transactional outbox: one row per follow-up job, written in the decision's transaction.

Celery delivers the job after commit, but PostgreSQL is what says a job exists and whether it has
finished: a lost message (Redis flushed, Redis down at commit, a worker killed) leaves a row that is
not done, and the beat sweep (interventions/jobs.py) delivers it again once its ``due_at`` passes.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

__all__ = ["Job"]


class Job(models.Model):
    PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
    STATUSES = [PENDING, RUNNING, DONE, FAILED]
    OPEN = (PENDING, RUNNING)
    KINDS = ["revalidation", "reconcile", "compensation", "recovery", "fleet_wave", "cascade"]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=20)
    # The intervention (revalidation, reconcile, recovery) or the compensation plan the job drives.
    target_id = models.CharField(max_length=64)
    # None for a job about no single run (a fleet operation's wave).
    run = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    status = models.CharField(max_length=10, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)  # deliveries that started the work
    failures = models.PositiveIntegerField(default=0)  # ... and that raised or never reported back
    last_error = models.TextField(blank=True)
    timeout_s = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    enqueued_at = models.DateTimeField(null=True, blank=True)  # last handed to the broker
    started_at = models.DateTimeField(null=True, blank=True)  # last delivery began
    finished_at = models.DateTimeField(null=True, blank=True)
    # Not done by then -> the sweep delivers it again (and counts a failure if a delivery had started).
    due_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "due_at"], name="job_open_due")]
        constraints = [
            models.UniqueConstraint(fields=["kind", "target_id"], name="one_job_per_target"),
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "running", "done", "failed"]),
                name="job_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} job {self.target_id} ({self.status})"
