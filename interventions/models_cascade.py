"""A tree-scoped pause or cancel, child by child: one row per descendant, written with the decision.

The rows are the cascade's list as it stood at the decision (what its receipt pages through) and its
progress: the cascade job (interventions/cascade.py) reaches each pending row in its own transaction
and marks it, so a job killed halfway resumes at the first row still pending and never reaches a
child twice.
"""

from __future__ import annotations

from django.db import models

__all__ = ["CascadeTarget"]


class CascadeTarget(models.Model):
    PENDING, CHANGED, UNCHANGED = "pending", "changed", "unchanged"
    STATUSES = [PENDING, CHANGED, UNCHANGED]

    id = models.BigAutoField(primary_key=True)
    intervention = models.ForeignKey(
        "interventions.Intervention", on_delete=models.PROTECT, related_name="cascade_targets"
    )
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="cascade_targets")
    position = models.PositiveIntegerField()  # breadth first from the intervention's run
    state_before = models.CharField(max_length=20)  # at the decision (or when the job found it)
    status = models.CharField(max_length=10, default=PENDING)
    state_after = models.CharField(max_length=20, blank=True)
    note = models.TextField(blank=True)  # why the contract did not change it
    reached_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(
                fields=["intervention", "run"], name="cascade_one_target_per_run"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "changed", "unchanged"]),
                name="cascade_target_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["intervention", "status", "position"], name="cascade_progress")
        ]
