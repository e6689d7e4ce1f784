"""Intake holds: a standing rule that new runs of a scope of the fleet are accepted and queued but not
claimed, until released. A scope is an agent (its name), a tool (runs holding a grant on it) or
everything. ``claim_run`` reads whether a live hold covers the run with one EXISTS in the claim's
facts (runs/services/facts.py); the work queue leaves held runs out (runs/work.py). Written by the
hold_intake and release_intake contracts (interventions/intake.py), each audited.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

__all__ = ["IntakeHold"]


class IntakeHold(models.Model):
    AGENT, TOOL, ALL = "agent", "tool", "all"
    SCOPES = (AGENT, TOOL, ALL)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    scope = models.CharField(max_length=10)  # agent | tool | all
    target = models.CharField(max_length=100, blank=True)  # the agent's or tool's name; "" for all
    # The team whose runs it holds (docs/operator/teams.md); NULL: every team's, which only the
    # cross_team right sets (rows from before teams were every team's, as they acted).
    team = models.ForeignKey(
        "runs.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField()
    held_by = models.CharField(max_length=150)
    role = models.CharField(max_length=50, blank=True)
    held_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.CharField(max_length=150, blank=True)
    release_reason = models.TextField(blank=True)
    # What the preview showed and the hold's receipt (the release's is added under "release").
    receipt = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-held_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(scope__in=["agent", "tool", "all"]), name="intake_scope_valid"
            ),
            models.CheckConstraint(
                condition=(models.Q(scope="all", target="") | ~models.Q(scope="all"))
                & (models.Q(scope="all") | ~models.Q(target="")),
                name="intake_target_matches_scope",
            ),
            models.CheckConstraint(condition=~models.Q(reason=""), name="intake_reason_required"),
            # One live hold per scope and team (NULL, every team, is one value here); also the
            # index the claim's EXISTS uses.
            models.UniqueConstraint(
                fields=["scope", "target", "team"],
                condition=models.Q(released_at__isnull=True),
                name="one_live_intake_hold_of_team",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        return f"intake hold {self.scope}:{self.target or '*'}"

    @property
    def live(self) -> bool:
        return self.released_at is None
