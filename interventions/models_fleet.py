"""Fleet operations: one parent record for an intervention issued across a filtered set of runs in
waves, and one target row per run linking to that run's own intervention (its receipt).

The operation row is the lock every wave decision and every halt takes, so a halt and a wave cannot
both win: a per-run decision commits only while its operation is still running.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

__all__ = ["FleetOperation", "FleetTarget"]


class FleetOperation(models.Model):
    PREVIEWED, RUNNING, HALTED, COMPLETED, CANCELLED = (
        "previewed",
        "running",
        "halted",
        "completed",
        "cancelled",
    )
    STATES = [PREVIEWED, RUNNING, HALTED, COMPLETED, CANCELLED]
    FINISHED = (HALTED, COMPLETED, CANCELLED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # pause | resume | cancel | take_command; freeze_capability | restore_capability only on records
    # made before those kinds were retired (a fleet freeze is a standing freeze now)
    kind = models.CharField(max_length=30)
    run_filter = models.TextField()  # the query string the runs were selected by
    reason = models.TextField()
    options = models.JSONField(default=dict, blank=True)  # passed to each run's contract
    override_reason = models.TextField(blank=True)
    wave_size = models.PositiveIntegerField()
    pause_s = models.PositiveIntegerField(default=0)  # between waves
    # Error budget: the operation halts once more runs than this have failed.
    max_failures = models.PositiveIntegerField()
    max_failure_pct = models.FloatField(null=True, blank=True)  # as given, when given as a share
    state = models.CharField(max_length=10, default=RUNNING)
    total = models.PositiveIntegerField(default=0)
    excluded = models.PositiveIntegerField(default=0)  # matched but the contract did not apply
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    waves = models.PositiveIntegerField(default=0)
    current_wave = models.PositiveIntegerField(default=0)
    next_wave_at = models.DateTimeField(null=True, blank=True)
    digest = models.CharField(max_length=64, blank=True)  # of the previewed selection
    halted_reason = models.TextField(blank=True)
    halted_by = models.CharField(max_length=150, blank=True)
    halted_automatically = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    created_by_label = models.CharField(max_length=150)
    role = models.CharField(max_length=50, blank=True)
    # The team whose runs it acts on (NULL = the default team); cross_team people: any team's.
    team = models.ForeignKey(
        "runs.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(
                    state__in=["previewed", "running", "halted", "completed", "cancelled"]
                ),
                name="fleet_state_valid",
            ),
            models.CheckConstraint(condition=models.Q(wave_size__gte=1), name="fleet_wave_size"),
            models.CheckConstraint(condition=~models.Q(reason=""), name="fleet_reason_required"),
        ]

    def __str__(self) -> str:
        return f"fleet {self.kind} {self.pk} ({self.state})"

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.skipped


class FleetTarget(models.Model):
    PENDING, SUCCEEDED, FAILED, SKIPPED = "pending", "succeeded", "failed", "skipped"
    STATUSES = [PENDING, SUCCEEDED, FAILED, SKIPPED]

    id = models.BigAutoField(primary_key=True)
    operation = models.ForeignKey(FleetOperation, on_delete=models.PROTECT, related_name="targets")
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="fleet_targets")
    position = models.PositiveIntegerField()
    wave = models.PositiveIntegerField()
    status = models.CharField(max_length=10, default=PENDING)
    # The run's own intervention: its receipt. Set in that decision's transaction.
    intervention = models.OneToOneField(
        "interventions.Intervention",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="fleet_target",
    )
    error = models.CharField(max_length=50, blank=True)  # the refusal's code
    detail = models.TextField(blank=True)  # why it failed or was skipped
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["operation", "run"], name="fleet_one_target_per_run"),
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "succeeded", "failed", "skipped"]),
                name="fleet_target_status_valid",
            ),
        ]
        indexes = [models.Index(fields=["operation", "wave", "status"], name="fleet_target_wave")]
