"""Interventions: one operator action each, with its preview, receipt and follow-up jobs."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


class Intervention(models.Model):
    APPLIED, PENDING, COMPLETED, FAILED = "applied", "pending", "completed", "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="interventions")
    kind = models.CharField(max_length=30)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    actor_label = models.CharField(max_length=150)
    role = models.CharField(max_length=50, blank=True)
    reason = models.TextField()
    scope = models.CharField(max_length=10, default="run")
    options = models.JSONField(default=dict, blank=True)
    override = models.BooleanField(default=False)
    override_reason = models.TextField(blank=True)
    preview = models.JSONField(default=dict, blank=True)
    receipt = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=12, default=APPLIED)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(reason=""), name="intervention_reason_required"
            ),
            models.CheckConstraint(
                condition=models.Q(scope__in=["run", "tree"]), name="intervention_scope_valid"
            ),
        ]


from interventions.models_cascade import *  # noqa: E402, F403  (CascadeTarget: a tree cascade's rows)
from interventions.models_compensation import *  # noqa: E402, F403  (CompensationPlan, CompensationStep)
from interventions.models_fleet import *  # noqa: E402, F403  (FleetOperation, FleetTarget)
from interventions.models_jobs import *  # noqa: E402, F403  (Job: the follow-up job outbox)
