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

__all__ = ["CapabilityFreeze", "StandingFreeze"]


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


class StandingFreeze(models.Model):
    """A freeze that stands over a scope of the fleet until restored: every run it covers -- created,
    claimed, resumed, retried or delegated to before or after it was set -- has its declarations of
    ``capability`` denied ``capability_frozen``, naming this freeze, who set it and why.

    ``over``: ``everything``; ``agent`` (its runs); or ``filter``, a run-list query string over what a
    run is (agent, owner, goal text, id, tools touched: runs/freezes.py evaluates it). A freeze of a
    whole tool is the capability ``tool:*``. The declaration reads the live ones covering its
    tool:action in its one facts statement (runs/services/effects.py); restore lifts one for every run
    at once (interventions/fleet/freezes.py). Per-run freezes (CapabilityFreeze) are separate."""

    EVERYTHING, AGENT, FILTER = "everything", "agent", "filter"
    OVER = [EVERYTHING, AGENT, FILTER]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    capability = models.CharField(max_length=200)  # "tool:action" or "tool:*"
    over = models.CharField(max_length=10)
    agent = models.ForeignKey(
        "runs.Agent", null=True, blank=True, on_delete=models.PROTECT, related_name="freezes"
    )
    run_filter = models.TextField(blank=True)
    # The team whose runs it covers (docs/operator/teams.md); NULL: every team's, which only the
    # cross_team right sets (rows from before teams were every team's, as they acted).
    team = models.ForeignKey(
        "runs.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField()
    frozen_by = models.CharField(max_length=150)
    frozen_at = models.DateTimeField(default=timezone.now)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.CharField(max_length=150, blank=True)
    lift_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-frozen_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(over__in=["everything", "agent", "filter"]),
                name="standing_freeze_over_valid",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(over="agent", agent__isnull=False, run_filter="")
                    | models.Q(over="filter", agent__isnull=True) & ~models.Q(run_filter="")
                    | models.Q(over="everything", agent__isnull=True, run_filter="")
                ),
                name="standing_freeze_scope_matches_over",
            ),
            models.CheckConstraint(
                condition=~models.Q(reason=""), name="standing_freeze_reason_required"
            ),
            # One live freeze per capability, scope and team (NULL, every team, is one value here);
            # its leading column is also the index the declaration's lookup (capability IN
            # (tool:action, tool:*), live) walks.
            models.UniqueConstraint(
                fields=["capability", "over", "run_filter", "team"],
                condition=models.Q(lifted_at__isnull=True, agent__isnull=True),
                name="one_live_standing_freeze_of_team",
                nulls_distinct=False,
            ),
            models.UniqueConstraint(
                fields=["capability", "agent", "team"],
                condition=models.Q(lifted_at__isnull=True, agent__isnull=False),
                name="one_live_standing_freeze_per_agent_of_team",
                nulls_distinct=False,
            ),
        ]

    @property
    def live(self) -> bool:
        return self.lifted_at is None

    @property
    def scope_label(self) -> str:
        if self.over == self.AGENT:
            return f"agent {self.agent.name if self.agent else '?'}"
        if self.over == self.FILTER:
            return f"runs matching {self.run_filter}"
        return "every run"
