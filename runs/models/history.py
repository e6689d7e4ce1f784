"""Per-run durable record: hash-chained history, checkpoints, assumptions and timers."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from audit.triggers import append_only


class HistoryEvent(models.Model):
    """Append-only (PostgreSQL triggers refuse UPDATE, DELETE and TRUNCATE), sequence-numbered,
    hash-chained."""

    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="history")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=50)
    attempt = models.ForeignKey(
        "runs.Attempt", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor = models.CharField(max_length=150, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="history_seq_unique_per_run")
        ]
        triggers = append_only("history")


class Checkpoint(models.Model):
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="checkpoints")
    attempt = models.ForeignKey(
        "runs.Attempt", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    seq = models.PositiveIntegerField()
    step = models.CharField(max_length=100)
    state = models.JSONField(default=dict, blank=True)
    versions = models.JSONField(default=dict, blank=True)
    history_seq = models.PositiveIntegerField(
        default=0
    )  # history position the snapshot corresponds to
    hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="checkpoint_seq_unique_per_run")
        ]
        # A checkpoint is written once and hashed; recovery restarts from it and checks the hash.
        triggers = append_only("checkpoint")


class Assumption(models.Model):
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="assumptions")
    key = models.CharField(max_length=200)  # e.g. "price:sku-1"
    value = models.JSONField(null=True)
    step = models.CharField(max_length=100, blank=True)
    observed_at = models.DateTimeField(default=timezone.now)
    max_age_s = models.PositiveIntegerField(null=True, blank=True)
    checker = models.CharField(max_length=100, blank=True)  # registered assumption checker name
    meta = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run", "observed_at"]


class Timer(models.Model):
    PENDING, FIRED, DELIVERED, CANCELLED = "pending", "fired", "delivered", "cancelled"

    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="timers")
    name = models.CharField(max_length=100)
    fire_at = models.DateTimeField(db_index=True)
    status = models.CharField(max_length=10, default=PENDING)
    set_at = models.DateTimeField(default=timezone.now)
    fired_at = models.DateTimeField(null=True, blank=True)
    fired_while = models.CharField(
        max_length=20, blank=True
    )  # run state when it fired (e.g. paused)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["fire_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "fired", "delivered", "cancelled"]),
                name="timer_status_valid",
            ),
        ]
