"""Capability freezes: one ``tool:action`` (or ``tool:*``) held back on one run, whatever its grants.

A freeze is narrower than suspending a grant: freezing ``payments:charge`` on a run whose grant is
``payments:*`` still lets it refund. ``declare_effect`` looks for a live freeze with one indexed
lookup (``runs/services/freeze.py``). Written by the freeze and restore contracts
(``interventions/freeze.py``), one per run, each audited; a fleet operation freezes many at once.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

__all__ = ["CapabilityFreeze"]


class CapabilityFreeze(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="freezes")
    scope = models.CharField(max_length=200)  # "tool:action" or "tool:*"
    reason = models.TextField()
    frozen_by = models.CharField(max_length=150)
    # The intervention that froze it (an id, not a key: runs/ does not know interventions/).
    intervention_id = models.UUIDField(null=True, blank=True)
    frozen_at = models.DateTimeField(default=timezone.now)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.CharField(max_length=150, blank=True)
    lift_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["frozen_at"]
        constraints = [
            # One live freeze per run and scope; also the index the declaration's lookup uses.
            models.UniqueConstraint(
                fields=["run", "scope"],
                condition=models.Q(lifted_at__isnull=True),
                name="one_live_freeze_per_scope",
            ),
        ]

    @property
    def live(self) -> bool:
        return self.lifted_at is None
