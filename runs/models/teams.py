"""Teams: who owns which agents, runs, worker tokens and fleet operations (docs/operator/teams.md).

Roles stay global; a team says *which* runs a person's roles apply to. An owned row with no team
(``team`` NULL) belongs to the default team: rows written before teams existed, or by a release that
does not know them, need no backfill. A person with no membership is in the default team.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

DEFAULT_TEAM = (
    "default"  # the slug of the team that NULL means; a Team row by that name is optional
)


class Team(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class TeamMembership(models.Model):
    """A person in a team. Written only by runs.services.teams (audited); one row per (team, user),
    which the database enforces, so two concurrent adds leave one row."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="team_membership_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.team_id}"
